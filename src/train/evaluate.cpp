#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/memory.h"
#include "train/data_loader.h"

namespace loom::train {

EvalResult evaluate_shards(model::Model& model, const std::vector<std::string>& shards) {
  const int64_t B = model.batch_size(), T = model.seq_len();
  DataLoaderOptions o;
  o.shards = shards;
  o.batch = B;
  o.seq_len = T;
  o.vocab_size = model.config().vocab_size;
  DataLoader data(o);
  Pools pools;
  OwnedTensor tokens = pools[MemTag::activations].zeros(DType::i32, {B, T});
  OwnedTensor targets = pools[MemTag::activations].zeros(DType::i32, {B, T});
  const std::span<int32_t> tok(tokens.data_as<int32_t>(), B * T), tgt(targets.data_as<int32_t>(), B * T);
  const EvaluationForwards evaluating({&model});
  EvalResult r;
  r.windows = data.windows_per_epoch();
  double sum = 0;  // loss summed over tokens
  for (int64_t first = 0; first < r.windows; first += B) {
    data.batch_at(first, tok, tgt);
    const int64_t rows = std::min(B, r.windows - first);
    // Rows past the last window wrapped to the epoch's start: ignore them.
    std::fill(tgt.begin() + rows * T, tgt.end(), -100);
    sum += static_cast<double>(model.forward(tokens, targets)) * static_cast<double>(rows * T);
  }
  r.tokens = r.windows * T;
  r.loss = sum / static_cast<double>(r.tokens);
  r.perplexity = std::exp(r.loss);
  return r;
}

}  // namespace loom::train
