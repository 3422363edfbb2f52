#include "infer/token_grammar.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace loom::infer {
namespace {

std::vector<std::string> token_bytes_of(const text::Tokenizer& tok, int64_t vocab_size, const text::ShownTokens& shown) {
  std::vector<std::string> bytes(static_cast<size_t>(vocab_size));
  for (int32_t t = 0; t < std::min<int64_t>(vocab_size, tok.vocab_size()); ++t) bytes[static_cast<size_t>(t)] = tok.token_bytes(t);
  for (const auto& [t, text] : shown)
    if (t >= 0 && t < vocab_size) bytes[static_cast<size_t>(t)] = text;
  return bytes;
}

}  // namespace

GrammarVocab::GrammarVocab(const text::Tokenizer& tok, int64_t vocab_size, const text::ShownTokens& shown)
    : GrammarVocab(token_bytes_of(tok, vocab_size, shown)) {}

GrammarVocab::GrammarVocab(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)), trie_(bytes_) {}

int64_t GrammarVocab::memory_bytes() const {
  int64_t n = trie_.bytes() + static_cast<int64_t>(bytes_.capacity() * sizeof(std::string));
  for (const std::string& b : bytes_) n += b.capacity() > 15 ? static_cast<int64_t>(b.capacity()) : 0;  // past SSO
  return n;
}

SequenceGrammar::SequenceGrammar(const TokenGrammar& g, std::vector<int32_t> end_tokens)
    : vocab_(g.vocab), matcher_(g.grammar), end_tokens_(std::move(end_tokens)) {
  LOOM_REQUIRE(vocab_ != nullptr, "a grammar needs the model's vocabulary");
  LOOM_REQUIRE(!end_tokens_.empty(), "a grammar needs a token that ends the output (EOS or a stop token)");
}

void SequenceGrammar::allowed(std::vector<uint8_t>& mask) const {
  allowed_tokens(matcher_, vocab_->trie(), mask);
  if (matcher_.can_end() || !std::count(mask.begin(), mask.end(), uint8_t{1}))
    for (int32_t t : end_tokens_)
      if (t >= 0 && t < static_cast<int32_t>(mask.size())) mask[static_cast<size_t>(t)] = 1;
}

void SequenceGrammar::accept(int32_t token) {
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) return;
  LOOM_CHECK(matcher_.accept(vocab_->bytes(token)), "grammar: token ", token, " was sampled but is not allowed");
}

}  // namespace loom::infer
