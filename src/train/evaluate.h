// Mean next-token loss of a model over every window of token shards, read in
// order (`loom eval`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"

namespace loom::train {

struct EvalResult {
  double loss = 0;        // mean over every predicted token
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // predicted tokens: windows * T
  int64_t windows = 0;
};

// The models' forwards are an evaluation's (Model::set_training(false): MoE
// layers drop no routing choice) while this lives; training's after.
class EvaluationForwards {
 public:
  explicit EvaluationForwards(std::vector<model::Model*> models) : models_(std::move(models)) {
    for (model::Model* m : models_) m->set_training(false);
  }
  ~EvaluationForwards() {
    for (model::Model* m : models_) m->set_training(true);
  }
  EvaluationForwards(const EvaluationForwards&) = delete;
  EvaluationForwards& operator=(const EvaluationForwards&) = delete;

 private:
  std::vector<model::Model*> models_;
};

// Every window of T + 1 tokens (data_loader.h) of `shards`, in order, in
// batches of model.batch_size() (the last batch masks the windows past the
// end), T = model.seq_len(), as an evaluation (EvaluationForwards).
EvalResult evaluate_shards(model::Model& model, const std::vector<std::string>& shards);

}  // namespace loom::train
