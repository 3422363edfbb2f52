// loom models in GGUF files (ggml's docs/gguf.md), as llama.cpp lays them
// out: the architecture keys and tensor names of its "gpt2" and "llama"
// architectures, written from and read into loom's flat f32 parameters
// (param_specs order). The tokenizer's keys are the caller's (cli/).
//
// Names (loom's HF-style name -> GGUF):
//   gpt2   wte -> token_embd, wpe -> position_embd, h.N.ln_1 -> blk.N.attn_norm,
//          attn.c_attn -> attn_qkv, attn.c_proj -> attn_output, ln_2 -> ffn_norm,
//          mlp.c_fc -> ffn_up, mlp.c_proj -> ffn_down, ln_f -> output_norm
//   llama  model.embed_tokens -> token_embd, input_layernorm -> attn_norm,
//          self_attn.{q,k,v,o}_proj -> attn_{q,k,v,output},
//          post_attention_layernorm -> ffn_norm, mlp.{gate,up,down}_proj ->
//          ffn_{gate,up,down}, model.norm -> output_norm; MoE layers:
//          block_sparse_moe.gate -> ffn_gate_inp and the experts stacked into
//          ffn_{gate,down,up}_exps (ne = {in, out, n_expert})
//   both   lm_head -> output (untied models only; a tied model has none and
//          llama.cpp reads token_embd, as loom does)
// A weight (OC, IC) row-major is ne = {IC, OC}: loom's layout as it is
// (GPT-2's Conv1D transpose is a Hugging Face file's, not loom's).
//
// Llama's q_proj and k_proj rows are permuted as llama.cpp's converter does
// (convert_hf_to_gguf.py): loom's RoPE pairs element i with i + HS/2 of each
// head (Hugging Face's rotate_half), llama.cpp's llama pairs 2i with 2i + 1,
// so row h*HS + half*HS/2 + i is written at h*HS + 2i + half; reading undoes it.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/gguf.h"
#include "kernels/quant.h"
#include "model/config.h"
#include "model/params.h"

namespace loom::model {

class QuantWeights;  // model/quant_weights.h

// What a GGUF file loom writes stores its weight matrices as. Vectors (norms,
// biases) stay f32. q4_K_M and q5_K_M are llama.cpp's mixes: q4_K (q5_K),
// with q6_K for the output matrix (token_embd when tied) and for ffn_down
// and attn_v (gpt2's attn_qkv likewise) of the layers llama.cpp's
// use_more_bits picks (the first and last eighth, and every third between);
// an 8-expert model's attn_k and attn_v in q8_0 and its attn_output in
// q5_K. A matrix whose rows (ne[0]) are not a multiple of the type's block
// takes llama-quantize's fallback (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0,
// q2_K -> q4_0), or f16 where that does not fit either. loom reads q3_K
// (and every type here) but does not write it.
enum class GgufWeights { f32, f16, bf16, q8_0, q4_0, q4_K, q6_K, q4_K_M, q4_1, q5_0, q5_1, q2_K, q5_K, q5_K_M };
// "f32", ..., "q5_K_M"; another name is a loom::Error listing the allowed ones.
GgufWeights gguf_weights_from_name(std::string_view name);
std::string_view gguf_weights_name(GgufWeights w);
// llama.cpp's general.file_type (enum llama_ftype) of a file of such weights.
io::GgufFileType gguf_file_type(GgufWeights w);

// Adds general.architecture, general.name, general.file_type,
// general.quantization_version and the architecture's keys, then every
// parameter of the model. flat: (P) f32 in param_specs(cfg) order; it must
// stay valid until w.write() (tensors are converted while writing).
void gguf_add_model(io::GgufWriter& w, const ModelConfig& cfg, const Tensor& flat, GgufWeights weights,
                    const std::string& name);

// The model config of a GGUF file of architecture gpt2 or llama (MoE
// llama included). vocab_size from the token_embd tensor. Another
// architecture, or a key loom has no counterpart for (rope scaling), is a
// loom::Error naming the file and the key.
ModelConfig model_config_from_gguf(const io::GgufFile& f);
// flat (P) f32 in param_specs(cfg) order, from the file's tensors of any type
// loom can dequantize (f32, f16, bf16 and the block types of gguf_quant_type); a missing
// tensor, a shape that differs, or another type is a loom::Error naming it.
// The parameters `skip` holds (served in their blocks: quant_weights.h) are
// left unwritten. layout: where flat holds each parameter instead (a subset
// of param_specs(cfg) by name with offsets of its own, every parameter not
// skipped among them: a QLoRA base without room for its quantized linears),
// each place a spec of param_specs(cfg) or of a tp rank's param_specs(cfg,
// tp), whose slice it then holds (tp_slice's elements, padding 0).
void load_params_from_gguf(Tensor flat, const ModelConfig& cfg, const io::GgufFile& f,
                           const QuantWeights* skip = nullptr, std::span<const ParamSpec> layout = {});

// Whether GGUF tensor `gguf_name` has llama.cpp's Q/K row permutation (a
// llama model's attn_q / attn_k), and the loom row its GGUF row r holds:
// h*HS + half*HS/2 + i for r = h*HS + 2i + half (the permutation above).
// The one formula the writer and the reader both use.
bool gguf_rows_permuted(const ModelConfig& cfg, const std::string& gguf_name);
int64_t gguf_loom_row(int64_t r, int64_t head_size);
// Its inverse: the GGUF row that holds loom row r.
int64_t gguf_row_of_loom(int64_t r, int64_t head_size);

// The block type of a GGUF tensor type loom computes with in blocks (q8_0,
// q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K: kernels/quant.h), or
// none (f32, f16, bf16, others: the i-quants, ternary and fp4 types).
std::optional<kernels::QuantType> gguf_quant_type(io::GgmlType t);

// The GGUF name of a loom parameter name ("h.3.attn.c_attn.weight" ->
// "blk.3.attn_qkv.weight"); expert weights map to their stacked tensor.
std::string gguf_tensor_name(const ModelConfig& cfg, const std::string& loom_name);
// Where loom parameter `loom_name`'s `rows` rows lie in its GGUF tensor: the
// first, and how many rows the tensor holds. An expert's matrix is one slice
// of the stacked tensor ("model.layers.1.block_sparse_moe.experts.3.w1.weight":
// rows from 3 * rows, of rows * n_expert; expert >= 0); any other parameter
// is the whole tensor (expert -1).
struct GgufRows {
  int64_t first = 0, in_tensor = 0, expert = -1;
};
GgufRows gguf_rows_of(const ModelConfig& cfg, const std::string& loom_name, int64_t rows);

}  // namespace loom::model
