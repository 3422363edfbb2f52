#include "text/brown.h"

#include <vector>

namespace loom::text {

namespace {

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

bool attaches_left(std::string_view word) {
  return word == "." || word == "," || word == ";" || word == ":" || word == "?" || word == "!" || word == ")" ||
         word == "]" || word == "''";
}

bool attaches_right(std::string_view word) { return word == "(" || word == "[" || word == "``"; }

// Appends the words of one tagged sentence to `out`; `glue` is true when the
// next word joins the previous one without a space.
void append_sentence(std::string_view line, std::string& out, bool& glue) {
  size_t pos = 0;
  while (pos < line.size()) {
    const size_t start = line.find_first_not_of(" \t\r", pos);
    if (start == std::string_view::npos) break;
    size_t end = line.find_first_of(" \t\r", start);
    if (end == std::string_view::npos) end = line.size();
    std::string_view token = line.substr(start, end - start);
    pos = end;
    const size_t slash = token.rfind('/');
    std::string_view word = slash == std::string_view::npos || slash == 0 ? token : token.substr(0, slash);
    if (!out.empty() && !glue && !attaches_left(word) && out.back() != '\n') out += ' ';
    out += (word == "``" || word == "''") ? std::string_view("\"") : word;
    glue = attaches_right(word);
  }
}

}  // namespace

std::string brown_to_text(std::string_view tagged) {
  std::string out;
  out.reserve(tagged.size() / 2);
  bool glue = false;
  bool in_paragraph = false;
  size_t pos = 0;
  while (pos <= tagged.size()) {
    size_t nl = tagged.find('\n', pos);
    if (nl == std::string_view::npos) nl = tagged.size();
    const std::string_view line = tagged.substr(pos, nl - pos);
    pos = nl + 1;
    if (is_blank(line)) {
      if (in_paragraph) out += '\n';
      in_paragraph = false;
      glue = false;
      continue;
    }
    append_sentence(line, out, glue);
    in_paragraph = true;
  }
  if (in_paragraph) out += '\n';
  return out;
}

bool is_brown_file_name(std::string_view name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' && name[2] >= '0' &&
         name[2] <= '9' && name[3] >= '0' && name[3] <= '9';
}

}  // namespace loom::text
