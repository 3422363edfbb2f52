// Mean next-token loss of a model over every window of token shards, read in
// order (`loom eval`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace loom::train {

struct EvalResult {
  double loss = 0;        // mean over every predicted token
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // predicted tokens: windows * T
  int64_t windows = 0;
};

// Every window of T + 1 tokens (data_loader.h) of `shards`, in order, in
// batches of model.batch_size() (the last batch masks the windows past the
// end), T = model.seq_len().
EvalResult evaluate_shards(model::Model& model, const std::vector<std::string>& shards);

}  // namespace loom::train
