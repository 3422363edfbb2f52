// loom plan --serve: what a model serves on one device of a cluster — how
// many sequences its KV cache holds at once and the decode tokens/s the
// device's memory bandwidth allows — from the serving engine's own sizes:
// the weights it keeps, model::kv_block_bytes per block of the paged KV
// cache (infer/kv_cache_manager.h: a sequence holds whole blocks), and
// model::decode_weight_bytes, the bytes a decode step reads (as `loom bench
// serve --mode decode-bound` measures against).
//
// Sequences of input_len prompt tokens and output_len generated ones:
//   capacity   KV blocks = (memory - weights - reserve) / kv_block_bytes;
//              at once, without preemption: blocks / ceil((in + out) / bs)
//              sequences (each at its longest); on average
//              blocks / ceil((in + out / 2) / bs) (half-way through)
//   decode     a step of S sequences reads the weights once and each
//              sequence's K and V for its context (in + out / 2 on
//              average): bound = S x bandwidth / bytes, for S = 1 and for
//              the capacity (the most a device can decode together)
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "model/config.h"
#include "plan/cluster.h"

namespace loom::plan {

struct ServeRequest {
  model::ModelConfig model;
  DType weights = DType::bf16, kv = DType::bf16;
  int64_t input_len = 512, output_len = 256;
  int64_t block_size = 16;     // tokens per KV block (the engine's default)
  double reserve_bytes = 0;    // kept back from the KV cache (activations, the runtime)
  Cluster cluster;             // one device's memory and memory bandwidth
};

struct ServePlan {
  int64_t weight_bytes = 0;        // resident
  int64_t kv_bytes_per_token = 0;  // every layer's K and V
  int64_t kv_blocks = 0;
  int64_t sequences_at_once = 0;   // every one at input + output tokens
  int64_t sequences_on_average = 0;  // half-way through their output
  double decode_one = 0;           // tokens/s bound, one sequence
  double decode_full = 0;          // tokens/s bound, sequences_at_once decoding together
  int64_t decode_step_bytes_one = 0, decode_step_bytes_full = 0;
};

// A model whose weights do not fit the device is a plan with no KV blocks
// and no sequences (the table says so); bad sizes are loom::Errors.
ServePlan plan_serving(const ServeRequest& r);
std::string serve_plan_table(const ServePlan& p, const ServeRequest& r);
std::string serve_plan_json(const ServePlan& p);

}  // namespace loom::plan
