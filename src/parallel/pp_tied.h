// A tied embedding under pipeline parallelism (DESIGN.md §5 PP), Megatron's
// scheme: GPT-2's LM head reads the token embedding, so stage 0 (the
// embedding) and the last stage (the head) each hold a copy of it. Both start
// equal (sharding-invariant init), each backward adds to its own copy's
// gradient, and after the data-parallel reduction the two gradients are
// summed on both stages — so both copies take the same update and stay the
// same bits.
//
// The copies' gradients get a dp bucket of their own (DpOptions::
// solo_params): then under ZeRO-1 each stage's dp rank d holds the reduced
// gradient of the same slice of the embedding, and the two stages sum only
// that slice (1/dp of the table; the rest of a ZeRO-1 gradient is not read).
// Under ZeRO-0 the slice is the whole table.
//
//   TiedEmbedding tied(cfg, pp_group);              // collective over pp
//   dpo.solo_params = tied.solo_params(chunk);        // per chunk model
//   ... pipeline run, DataParallel::wait_gradients() on every chunk ...
//   tied.sum_grads(chunks, dps);                       // then norm, update
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/model.h"
#include "parallel/dp.h"

namespace loom::parallel {

class TiedEmbedding {
 public:
  // cfg: the model; pp: the pipeline group (mesh.pp()). With
  // tied embeddings and pp > 1 this splits pp into the embedding group (the
  // ranks of stage 0 and of the last stage): collective over pp.
  TiedEmbedding(const model::ModelConfig& cfg, comm::Communicator& pp);
  ~TiedEmbedding();
  TiedEmbedding(const TiedEmbedding&) = delete;
  TiedEmbedding& operator=(const TiedEmbedding&) = delete;

  // "wte.weight" (GPT-2), "model.embed_tokens.weight" (Llama).
  static std::string name(const model::ModelConfig& cfg);
  // The solo_params a chunk's DataParallel needs: the embedding when the
  // chunk holds one of two copies (stage 0 or the last stage, not both).
  std::vector<std::string> solo_params(const model::Model& chunk) const;
  // The same for a stage of cfg that holds the embeddings and / or the head
  // (loom plan lays out a chunk it does not build).
  static std::vector<std::string> solo_params(const model::ModelConfig& cfg, bool has_embedding, bool has_head);
  // Sums the two copies' reduced gradients (each chunk's DataParallel built
  // with solo_params and its gradients waited for): across the embedding
  // group, or on this rank when both copies are its chunks. Nothing when the
  // model is untied or one chunk holds the whole model.
  void sum_grads(const std::vector<model::Model*>& chunks, const std::vector<DataParallel*>& dps);

 private:
  bool tied_ = false;
  std::string name_;
  std::unique_ptr<comm::Communicator> group_;
};

}  // namespace loom::parallel
