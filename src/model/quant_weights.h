// A GGUF file's quantized linear weights, served in their blocks
// (kernels::linear_forward_quantized) instead of dequantized at load: what
// llama.cpp and ollama do with a q8_0 / q4_0 / q4_K_M file, and what makes
// its bytes per token the file's, not f32's.
//
// Which weights: the dense layers' linears (GPT-2 c_attn, attn c_proj, c_fc,
// mlp c_proj; Llama q/k/v/o, gate/up/down), a Mixtral layer's routed experts
// (w1 / w2 / w3, each expert's rows of ffn_{gate,down,up}_exps) and the LM
// head (lm_head, or token_embd when the embeddings are tied), where the file
// holds them in a block type of kernels/quant.h (q8_0, q4_0, q4_1, q5_0,
// q5_1, q2_K, q3_K, q4_K, q5_K, q6_K). Everything else (embeddings for the
// lookup, norms, biases, MoE routers, and any linear stored as f32 / f16 /
// bf16) is dequantized into the flat f32 parameters as before
// (load_params_from_gguf with `skip`). The activations stay f32: each row is
// quantized to q8_0 / q8_1 / q8_K inside the op, as llama.cpp does.
//
// The blocks are copied out of the file's mapping into the params pool, whose
// big buffers ask for huge pages: decode streams every weight once a token,
// and from the 4 KiB pages of a file mapping (where the hardware prefetcher
// stops at every page) gpt2-124m q8_0 decoded at 13.0-14.4 ms a token against
// 11.3 from the copy (BENCHMARKS.md, issue 35). A Llama attn_q / attn_k's rows
// are put back in loom's order on the way (the converter's permutation,
// gguf_model.h): a row of blocks moves whole, nothing is requantized.
//
// Batch invariance holds as for the float weights: the op's row bits depend
// only on that row and W (ops.h), at every instruction-set level.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/memory.h"
#include "core/tensor.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "model/config.h"
#include "model/params.h"

namespace loom::model {

class ParamViews;

class QuantWeights {
 public:
  // The quantized linears of f (which it keeps open) for the model cfg (as
  // model_config_from_gguf reads it). None when the file has no such tensor
  // (an f32 / f16 / bf16 file): empty(). With tp, the rank's slice of each
  // (param_specs(cfg, tp)'s rows; padding rows zero blocks) where it is
  // whole blocks: a row-parallel weight whose columns per rank are not a
  // multiple of its block (q4_K's 256 in GPT-2 small's attn.c_proj at tp 2)
  // is not held, and load_params_from_gguf dequantizes the rank's slice.
  QuantWeights(io::GgufFile f, const ModelConfig& cfg, Pool& pool, TpRank tp = {});
  QuantWeights(const QuantWeights&) = delete;
  // What the constructor would hold, without reading any block: the blocks'
  // bytes (bytes()) and the f32 bytes of the parameters they stand for
  // (f32_bytes()). For memory plans.
  struct Footprint {
    int64_t blocks = 0, f32_bytes = 0;
  };
  static Footprint footprint(const io::GgufFile& f, const ModelConfig& cfg, TpRank tp = {});
  QuantWeights& operator=(const QuantWeights&) = delete;

  bool empty() const { return by_name_.empty(); }
  // Whether loom parameter `name` is served from blocks (load_params_from_gguf
  // then skips it). "lm_head.weight" also stands for a tied head.
  bool holds(const std::string& name) const { return by_name_.count(name) > 0; }
  // The names held, in order.
  std::vector<std::string> names() const;
  // The blocks of `name`: u8 (rows, quant_row_bytes(type, cols)).
  const Tensor& blocks(const std::string& name) const;
  // The type of the weight a tensor views (one held, or rows of one: GPT-2's
  // q, k, v are row blocks of c_attn); a loom::Error for any other tensor.
  kernels::QuantType type_of(const Tensor& w) const;
  // Every held weight in place of its f32 view (the head's: blocks("lm_head.weight")).
  void substitute(ParamViews& views) const;
  // Bytes of the blocks, and of the f32 parameters they stand for.
  int64_t bytes() const { return bytes_; }
  int64_t f32_bytes() const { return f32_bytes_; }
  // "q4_K 120, q6_K 25" (matrices per type), for the start-up log.
  std::string summary() const;
  // The quantized linears not held because the tp rank's slice of them is
  // not whole blocks (dequantized into the flat parameters instead).
  const std::vector<std::string>& unsliced() const { return unsliced_; }
  const io::GgufFile& file() const { return file_; }

 private:
  struct Held {
    Tensor blocks;
    kernels::QuantType type;
  };
  // The blocks of tp rank's spec `mine` out of t, whose rows from `first`
  // hold the parameter (an expert's slice of a stacked tensor, or the whole
  // of a dense one).
  void hold(const ParamSpec& mine, const io::GgufTensorInfo& t, int64_t first, kernels::QuantType type, bool permute,
            int64_t head_size, Pool& pool);

  io::GgufFile file_;
  std::vector<OwnedTensor> owned_;        // the blocks, one tensor a weight
  std::map<std::string, Held> by_name_;
  std::map<const uint8_t*, Held> by_address_;  // first byte -> the weight, for type_of
  std::vector<std::string> unsliced_;
  int64_t bytes_ = 0, f32_bytes_ = 0;
};

struct ModelDir;  // model/config_json.h

// A model's weights as the serving engine takes them: the flat parameters
// in the compute dtype, and the quantized linears when the model is a GGUF
// file that has some and `dequantize` is false (then compute must be f32:
// a loom::Error that says what to pass otherwise). Else quant is null and
// every weight is dequantized into params, as before.
struct ServingWeights {
  OwnedTensor params;
  std::unique_ptr<QuantWeights> quant;
  // Bytes a step reads of the weights: params less the f32 places of the
  // quantized linears (never written), plus their blocks.
  int64_t bytes() const;
  const QuantWeights* quant_or_null() const { return quant.get(); }
};
// what: the flag that chose compute, for the error ("--dtype"). The blocks
// come from pool, and so do the params unless flat_pool is given.
ServingWeights load_serving_weights(const ModelDir& dir, DType compute, bool dequantize, const std::string& what,
                                    Pool& pool, Pool* flat_pool = nullptr);

}  // namespace loom::model
