#include "text/tokenizer.h"

namespace loom::text {

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<int32_t> ids = encode_special(text);
  if (add_bos() && bos_id() >= 0) ids.insert(ids.begin(), bos_id());
  return ids;
}

std::vector<int32_t> Tokenizer::encode_chat(std::string_view text) const {
  std::vector<int32_t> ids = encode_special(text);
  if (add_bos() && bos_id() >= 0 && (ids.empty() || ids.front() != bos_id())) ids.insert(ids.begin(), bos_id());
  return ids;
}

}  // namespace loom::text
