// Constrained decoding in the engine: a grammar (grammar.h) over the model's
// vocabulary. A request with GenerationParams::grammar has every sequence
// keep a SequenceGrammar; before each draw the tokens the grammar does not
// allow next are removed (their logits -inf, after which the sampler runs
// as it always does), and once the output is a whole sentence of the
// grammar the end tokens (EOS, stop tokens) are allowed too, alone when
// nothing may follow. The mask only removes tokens and depends on the
// sequence's own output, so a request's tokens still do not depend on its
// batch (DESIGN.md §8).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "infer/grammar.h"
#include "text/tokenizer.h"

namespace loom::infer {

// Each token's bytes (what it adds to the output) and their trie, built once
// per model: ids past the tokenizer (a padded vocabulary) and tokens that add
// no text are never allowed by a grammar; shown tokens have their text (a
// grammar may choose them, and the stream shows them: text_stream.h).
class GrammarVocab {
 public:
  GrammarVocab(const text::Tokenizer& tok, int64_t vocab_size, const text::ShownTokens& shown = {});
  explicit GrammarVocab(std::vector<std::string> token_bytes);  // index = token id
  const TokenTrie& trie() const { return trie_; }
  const std::string& bytes(int32_t token) const { return bytes_.at(static_cast<size_t>(token)); }
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  int64_t memory_bytes() const;  // the token bytes and the trie

 private:
  std::vector<std::string> bytes_;
  TokenTrie trie_;
};

struct TokenGrammar {
  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const GrammarVocab> vocab;
};

// One sequence's place in the grammar.
class SequenceGrammar {
 public:
  // end_tokens: the tokens that end the sequence (allowed once the output
  // is a whole sentence); loom::Error when there are none.
  SequenceGrammar(const TokenGrammar& g, std::vector<int32_t> end_tokens);
  // mask (resized to the vocabulary): 1 for a token that may come next.
  void allowed(std::vector<uint8_t>& mask) const;
  // The sampled token (one allowed() allowed); end tokens change nothing.
  void accept(int32_t token);

 private:
  std::shared_ptr<const GrammarVocab> vocab_;
  GrammarMatcher matcher_;
  std::vector<int32_t> end_tokens_;
};

}  // namespace loom::infer
