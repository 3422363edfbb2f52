// Internal to model/: a Model's memory layout, laid out once (llm.c) — the
// same code allocates it (Model's constructor) and counts it without
// allocating (Model::activation_bytes, state_bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/memory.h"
#include "model/model.h"
#include "model/model_state.h"

namespace loom::model {

// Allocates activation tensors from one pool and keeps their storage; the
// default dtype is the compute dtype. Without a pool it only counts bytes
// (Model::activation_bytes) and hands out tensors with no data.
struct Allocator {
  Pool* pool;
  std::vector<OwnedTensor>* owned;
  DType compute;
  int64_t bytes = 0, tensors = 0;
  Tensor operator()(Shape shape) { return (*this)(shape, compute); }
  Tensor operator()(Shape shape, DType dtype) {
    shape.validate();
    bytes += shape.numel() * static_cast<int64_t>(dtype_size(dtype));
    ++tensors;
    if (!pool) return Tensor(nullptr, dtype, shape);
    owned->push_back(pool->empty(dtype, shape));
    return owned->back();
  }
};

// What a stage lays out: its layers (all of them without pipeline
// parallelism), and whether it holds the embeddings (only then tokens are
// kept) and the head (the final norm, logits and targets).
struct StageShape {
  int64_t layers = 0;
  bool embedding = true, head = true;
  int64_t first_layer = 0;  // the model's index of its first layer (which are MoE layers)
};

// The sizes and the live collectives of a (B, T) micro-batch under tp: the
// one place that decides which parallel ops the blocks see (blocks.h
// ParallelOps).
Dims dims_of(const ModelConfig& cfg, int64_t B, int64_t T, const TpOptions& tp);
// Sizes the model cannot split: heads and d_ff are checked by param_specs;
// SP splits every sequence's tokens.
void check_tp(int64_t T, const TpOptions& tp);
// A MoE model's shared state and MLP step (model/moe.h), for (B, T)
// micro-batches; cfg must outlive st.
void init_moe(ModelState& st, const ModelConfig& cfg, int64_t T, const ModelOptions& options);
// A MoE model's micro-batch of B sequences holds whole routing groups;
// under cp its routing needs the cp group's collectives.
void check_moe(const ModelConfig& cfg, int64_t B, const CpOptions& cp);
// Context parallelism's options for a rank of T tokens: a loom::Error when
// the attention step or the positions are missing or wrong.
void check_cp(int64_t T, const CpOptions& cp);
// st.pos (and st.pos_bt, where the layout made it): 0..T-1, or the cp rank's
// positions for every sequence.
void set_positions(ModelState& st, const CpOptions& cp);
// The slots' activations (model_state.h), the positions and the backward
// scratch under the options' recompute policy (model.h), into st (whose dims
// are set; it adds the policy's dims.recompute_act).
void layout_activations(ModelState& st, Allocator& alloc, const ModelConfig& cfg, const ModelOptions& options,
                        const StageShape& stage);
// "1.5 GiB"
std::string gib(double bytes);
// The parameters a model built with these options holds (the adapters of
// an adapted one: ModelOptions::lora), validating what adapters do not
// support yet. O(1) in n_layer.
int64_t trainable_count(const ModelConfig& cfg, const ModelOptions& options);

}  // namespace loom::model
