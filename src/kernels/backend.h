// The kernel backend table (ggml's ggml_backend_i, as a plain table): one
// function pointer per op of ops.h, with the op's signature. ops.h checks the
// operands, then calls the entry of the backend registered for their device.
//
// A backend trusts what ops.h checked (shapes, dtypes, layout, one device)
// and checks only what needs the values (token ids, targets), with ops.h's
// messages. The CPU backend (kernels/cpu/cpu_ops.h) is built in; another
// (CUDA) registers itself with register_backend, once per process, before
// its first tensor reaches an op.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace loom::kernels {

// Every op a backend implements: X(name, return type, (parameters)), in
// ops.h order, without ops.h's default arguments. The one list behind the
// table's entries, its op names and the CPU backend's declarations.
// bf16_matmul_unsupported_reason is a query, not an op: it has no entry.
#define LOOM_KERNEL_OPS(X)                                                                                         \
  X(matmul, void, (Tensor c, const Tensor& a, const Tensor& b, const MatmulOpts& opts))                            \
  X(matmul_backward, void,                                                                                         \
    (Tensor da, Tensor db, const Tensor& dc, const Tensor& a, const Tensor& b, const MatmulOpts& opts))            \
  X(linear_forward, void, (Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias))                        \
  X(linear_gelu_forward, void, (Tensor y, Tensor pre, const Tensor& x, const Tensor& w, const Tensor& bias))       \
  X(linear_forward_invariant, void, (Tensor y, const Tensor& x, const Tensor& w, const Tensor& bias))              \
  X(linear_forward_quantized, void,                                                                                \
    (Tensor y, const Tensor& x, const Tensor& w, QuantType wtype, const Tensor& bias))                             \
  X(dequantize_rows, void, (Tensor out, const Tensor& w, QuantType wtype, int64_t first_row))                      \
  X(linear_backward, void,                                                                                         \
    (Tensor dx, Tensor dw, Tensor dbias, const Tensor& dy, const Tensor& x, const Tensor& w))                      \
  X(layernorm_forward, void,                                                                                       \
    (Tensor y, Tensor mean, Tensor rstd, const Tensor& x, const Tensor& w, const Tensor& b, float eps))            \
  X(layernorm_backward, void,                                                                                      \
    (Tensor dx, Tensor dw, Tensor db, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,       \
     const Tensor& rstd))                                                                                          \
  X(rmsnorm_forward, void, (Tensor y, Tensor rstd, const Tensor& x, const Tensor& w, float eps))                   \
  X(rmsnorm_backward, void,                                                                                        \
    (Tensor dx, Tensor dw, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd))                 \
  X(add_layernorm_forward, void,                                                                                   \
    (Tensor sum, Tensor y, Tensor mean, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w,             \
     const Tensor& bias, float eps))                                                                               \
  X(add_rmsnorm_forward, void,                                                                                     \
    (Tensor sum, Tensor y, Tensor rstd, const Tensor& a, const Tensor& b, const Tensor& w, float eps))             \
  X(gelu_forward, void, (Tensor y, const Tensor& x))                                                               \
  X(gelu_backward, void, (Tensor dx, const Tensor& dy, const Tensor& x))                                           \
  X(silu_forward, void, (Tensor y, const Tensor& x))                                                               \
  X(silu_backward, void, (Tensor dx, const Tensor& dy, const Tensor& x))                                           \
  X(swiglu_forward, void, (Tensor y, const Tensor& gate, const Tensor& up))                                        \
  X(swiglu_backward, void, (Tensor dgate, Tensor dup, const Tensor& dy, const Tensor& gate, const Tensor& up))     \
  X(rope_forward, void, (Tensor y, const Tensor& x, const Tensor& pos, float theta))                               \
  X(rope_backward, void, (Tensor dx, const Tensor& dy, const Tensor& pos, float theta))                            \
  X(softmax_forward, void, (Tensor y, const Tensor& x))                                                            \
  X(softmax_backward, void, (Tensor dx, const Tensor& dy, const Tensor& y))                                        \
  X(embedding_forward, void,                                                                                       \
    (Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t pos_offset))                    \
  X(embedding_backward, void, (Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t pos_offset)) \
  X(embedding_forward_at, void,                                                                                    \
    (Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& positions))                \
  X(embedding_backward_at, void,                                                                                   \
    (Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, const Tensor& positions))                   \
  X(embedding_shard_forward, void,                                                                                 \
    (Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin, const Tensor& wpe, int64_t pos_offset)) \
  X(embedding_shard_backward, void,                                                                                \
    (Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t vocab_begin, int64_t pos_offset))   \
  X(embedding_shard_forward_at, void,                                                                              \
    (Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin, const Tensor& wpe,                    \
     const Tensor& positions))                                                                                     \
  X(embedding_shard_backward_at, void,                                                                             \
    (Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t vocab_begin,                        \
     const Tensor& positions))                                                                                     \
  X(moe_top_k, void, (Tensor sel, Tensor weight, const Tensor& scores, const Tensor& bias, bool normalise))        \
  X(moe_router_scores, void, (Tensor scores, Tensor lse, const Tensor& logits, bool sigmoid))                     \
  X(moe_capacity, void,                                                                                            \
    (Tensor keep, const Tensor& sel, const Tensor& scores, int64_t group_tokens, int64_t capacity))                \
  X(moe_assign_rows, void, (Tensor rows, Tensor counts, const Tensor& sel))                                        \
  X(moe_group_stats, void,                                                                                         \
    (Tensor count, Tensor score_sum, const Tensor& sel, const Tensor& scores, int64_t group_tokens, bool sigmoid))  \
  X(moe_router_backward, void, (Tensor dlogits, const MoeRouterGrad& g))                                           \
  X(moe_dispatch, void, (Tensor xs, const Tensor& x, const Tensor& rows))                                         \
  X(moe_dispatch_backward, void, (Tensor dx, const Tensor& dxs, const Tensor& rows))                               \
  X(moe_combine, void, (Tensor y, const Tensor& ys, const Tensor& rows, const Tensor& weight))                     \
  X(moe_combine_backward, void,                                                                                    \
    (Tensor dys, Tensor dweight, const Tensor& dy, const Tensor& ys, const Tensor& rows, const Tensor& weight))     \
  X(grouped_linear_forward, void,                                                                                  \
    (Tensor y, const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets, bool invariant))      \
  X(grouped_linear_backward, void,                                                                                 \
    (Tensor dx, std::span<const Tensor> dw, const Tensor& dy, const Tensor& x, std::span<const Tensor> w,          \
     std::span<const int64_t> offsets))                                                                            \
  X(attention_forward, void,                                                                                       \
    (Tensor out, Tensor lse, const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_pos))                    \
  X(attention_backward, void,                                                                                      \
    (Tensor dq, Tensor dk, Tensor dv, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,        \
     const Tensor& out, const Tensor& lse, int64_t q_pos))                                                         \
  X(attention_merge, void, (Tensor acc, Tensor acc_lse, const Tensor& out, const Tensor& lse))                     \
  X(kv_cache_write, void, (Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v, const Tensor& slots)) \
  X(paged_attention_forward, void,                                                                                 \
    (Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,         \
     const Tensor& seq_lens, const Tensor& query_start))                                                           \
  X(cross_entropy_forward_backward, float,                                                                         \
    (Tensor dlogits, Tensor losses, const Tensor& logits, const Tensor& targets, int32_t ignore_index, float dloss)) \
  X(cross_entropy_shard_stats, void,                                                                               \
    (Tensor lse, Tensor target_logit, const Tensor& logits, const Tensor& targets, int64_t vocab_begin,            \
     int64_t valid, int32_t ignore_index))                                                                         \
  X(cross_entropy_shard_backward, void,                                                                            \
    (Tensor dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets, int64_t vocab_begin,          \
     int64_t valid, float scale, int32_t ignore_index))                                                            \
  X(cross_entropy_shard_combine, void, (Tensor lse, Tensor target_logit, const Tensor& stats))                     \
  X(cross_entropy_shard_loss, float,                                                                               \
    (const Tensor& lse, const Tensor& target_logit, const Tensor& targets, int32_t ignore_index))                  \
  X(cross_entropy_count_valid, int64_t, (const Tensor& targets, int32_t ignore_index))                             \
  X(adamw_step, void,                                                                                              \
    (Tensor param, Tensor m, Tensor v, const Tensor& grad, Tensor param_copy, const AdamWConfig& cfg))             \
  X(sum_squares, double, (const Tensor& t))                                                                        \
  X(sum_squares_blocks, void, (std::span<double> sums, std::span<const Tensor> tensors, int64_t block))          \
  X(global_norm, double, (std::span<const Tensor> tensors))                                                        \
  X(all_finite, bool, (const Tensor& t))                                                                           \
  X(scale, void, (Tensor t, float s))                                                                              \
  X(add, void, (Tensor y, const Tensor& a, const Tensor& b))                                                       \
  X(mul, void, (Tensor y, const Tensor& a, const Tensor& b))                                                       \
  X(cast, void, (Tensor dst, const Tensor& src))                                                                   \
  X(fill, void, (Tensor t, float value))                                                                           \
  X(copy, void, (Tensor dst, const Tensor& src))                                                                   \
  X(gather_columns, void, (Tensor dst, const Tensor& src, const Tensor& columns))                                  \
  X(arange, void, (Tensor t, int64_t start))                                                                       \
  X(find_id_outside, IdOutside, (const Tensor& ids, int64_t limit, std::optional<int32_t> ignore_index))

// A device's clock, for the op tracer (op_trace.h) on a device whose ops
// run after the host has queued them: mark() records a point on the stream
// the ops run on, elapsed_us(a, b) waits until the device reaches b and
// gives the device's microseconds from a to b, release(m) ends a mark.
struct DeviceClock {
  void* (*mark)() = nullptr;
  double (*elapsed_us)(void* from, void* to) = nullptr;
  void (*release)(void* mark) = nullptr;
};

struct Backend {
  const char* name = nullptr;  // "cpu": in messages
  Device::Kind kind = Device::Kind::cpu;
  const DeviceClock* clock = nullptr;  // null: an op's time is the host's (it ran before returning)
#define LOOM_KERNEL_OP_ENTRY(op, ret, params) ret(*op) params = nullptr;
  LOOM_KERNEL_OPS(LOOM_KERNEL_OP_ENTRY)
#undef LOOM_KERNEL_OP_ENTRY
};

// The table's op names, in table order.
std::span<const char* const> backend_op_names();
// The ops b leaves null, in table order (empty for a complete backend).
std::vector<std::string> backend_missing_ops(const Backend& b);

// Makes b the backend of every device of its kind. b must outlive every op
// call (a static table). loom::Error if an op is missing or another backend
// already serves that kind. Thread-safe, but not meant to race with op calls
// on that kind's tensors.
void register_backend(const Backend& b);
// The backend serving d, or null.
const Backend* find_backend(Device d);
// Every registered backend, the CPU one first.
std::vector<const Backend*> registered_backends();

}  // namespace loom::kernels
