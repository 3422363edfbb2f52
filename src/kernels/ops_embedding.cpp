// Embeddings (ops.h): operand checks, then the backend's op. The token ids
// themselves are checked by the backend, which reads them.
#include <algorithm>
#include <optional>

#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

void check_vocab_begin(const char* op, int64_t vocab_begin) {
  if (vocab_begin < 0) fail(op, ": vocab_begin ", vocab_begin, " is negative: a shard's first row id is >= 0");
}

// Positions pos_offset + t for t in [0, T) are rows of a (maxT, C) table.
void check_positions(const char* op, int64_t pos_offset, int64_t T, int64_t maxT) {
  if (T == 0) return;
  if (pos_offset < 0) fail(op, ": pos_offset ", pos_offset, " is negative: allowed positions are [0, ", maxT, ")");
  if (T > maxT || pos_offset > maxT - T) {  // pos_offset + T > maxT, without overflow
    const int64_t t = std::max<int64_t>(0, maxT - pos_offset);  // the first position past the table
    fail(op, ": position ", pos_offset + t, " (pos_offset ", pos_offset, " + t ", t,
         ") is past the position table's ", maxT, " rows: allowed positions are [0, ", maxT, ")");
  }
}

// A (rows, C) float table whose column count must be C.
void check_table(const char* op, Operand table, int64_t C) {
  require_contiguous(op, {table});
  require_float(op, table);
  require_ndim(op, table, 2);
  if (table.t.size(1) != C) op_fail(op, {table}, table.name, " has ", table.t.size(1), " columns, expected C = ", C);
}

void check_tokens_operand(const char* op, const Tensor& tokens) {
  require_contiguous(op, {{"tokens", tokens}});
  require_dtype(op, {"tokens", tokens}, DType::i32);
  require_ndim(op, {"tokens", tokens}, 2);
}

// positions: (B, T) i32 like tokens; their values are checked by the backend, which reads them.
void check_positions_operand(const char* op, const Tensor& positions, const Tensor& tokens) {
  require_contiguous(op, {{"positions", positions}});
  require_dtype(op, {"positions", positions}, DType::i32);
  require_shape(op, {"positions", positions}, tokens.shape());
}

// Operands of a forward but the token values: tokens (B, T) i32, wte (rows, C)
// float, y (B, T, C) and wpe (maxT, C) or undefined in wte's dtype. pos_offset:
// nullopt when the positions are a tensor (check_positions_operand).
void check_forward(const char* op, const Tensor& y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                   std::optional<int64_t> pos_offset) {
  check_tokens_operand(op, tokens);
  require_contiguous(op, {{"wte", wte}});
  require_float(op, {"wte", wte});
  require_ndim(op, {"wte", wte}, 2);
  const int64_t B = tokens.size(0), T = tokens.size(1), C = wte.size(1);
  require_contiguous(op, {{"y", y}});
  require_same_dtype(op, {"y", y}, {"wte", wte});
  require_shape(op, {"y", y}, Shape{B, T, C});
  if (wpe.defined()) {
    check_table(op, {"wpe", wpe}, C);
    require_same_dtype(op, {"wpe", wpe}, {"wte", wte});
    if (pos_offset) check_positions(op, *pos_offset, T, wpe.size(0));
  }
}

// Operands of a backward but the token values: dy (B, T, C) with (B, T) from
// tokens; dwte (rows, C), dwpe (maxT, C), each float or undefined. pos_offset
// as check_forward's.
void check_backward(const char* op, const Tensor& dwte, const Tensor& dwpe, const Tensor& dy, const Tensor& tokens,
                    std::optional<int64_t> pos_offset) {
  check_tokens_operand(op, tokens);
  require_contiguous(op, {{"dy", dy}});
  require_float(op, {"dy", dy});
  require_ndim(op, {"dy", dy}, 3);
  const int64_t B = tokens.size(0), T = tokens.size(1), C = dy.size(2);
  if (dy.size(0) != B || dy.size(1) != T)
    op_fail(op, {{"dy", dy}, {"tokens", tokens}}, "dy must have shape (B, T, C) with (B, T) from tokens");
  if (dwte.defined()) check_table(op, {"dwte", dwte}, C);
  if (dwpe.defined()) {
    check_table(op, {"dwpe", dwpe}, C);
    if (pos_offset) check_positions(op, *pos_offset, T, dwpe.size(0));
  }
  require_grads_apart(op, {{"dwte", dwte}, {"dwpe", dwpe}}, {{"dy", dy}, {"tokens", tokens}});
}

}  // namespace

// tokens: (B, T) i32  wte: (V, C)  wpe: (maxT, C) in wte's dtype or undefined  y: (B, T, C) in wte's dtype
void embedding_forward(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe, int64_t pos_offset) {
  constexpr const char* op = "embedding_forward";
  check_forward(op, y, tokens, wte, wpe, pos_offset);
  backend_of(op, {{"y", y}, {"tokens", tokens}, {"wte", wte}, {"wpe", wpe}})
      .embedding_forward(y, tokens, wte, wpe, pos_offset);
}

// positions: (B, T) i32; their values are checked by the backend, which reads them.
void embedding_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                          const Tensor& positions) {
  constexpr const char* op = "embedding_forward_at";
  check_forward(op, y, tokens, wte, wpe, std::nullopt);
  check_positions_operand(op, positions, tokens);
  backend_of(op, {{"y", y}, {"tokens", tokens}, {"wte", wte}, {"wpe", wpe}, {"positions", positions}})
      .embedding_forward_at(y, tokens, wte, wpe, positions);
}

// dy: (B, T, C) float  dwte: (V, C), dwpe: (maxT, C), each f32, bf16, f16 or undefined.
void embedding_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t pos_offset) {
  constexpr const char* op = "embedding_backward";
  check_backward(op, dwte, dwpe, dy, tokens, pos_offset);
  backend_of(op, {{"dwte", dwte}, {"dwpe", dwpe}, {"dy", dy}, {"tokens", tokens}})
      .embedding_backward(dwte, dwpe, dy, tokens, pos_offset);
}

// positions: (B, T) i32; their values are checked by the backend, which reads them.
void embedding_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                           const Tensor& positions) {
  constexpr const char* op = "embedding_backward_at";
  check_backward(op, dwte, dwpe, dy, tokens, std::nullopt);
  check_positions_operand(op, positions, tokens);
  require_grads_apart(op, {{"dwte", dwte}, {"dwpe", dwpe}}, {{"positions", positions}});
  backend_of(op, {{"dwte", dwte}, {"dwpe", dwpe}, {"dy", dy}, {"tokens", tokens}, {"positions", positions}})
      .embedding_backward_at(dwte, dwpe, dy, tokens, positions);
}

// tokens: (B, T) i32 >= 0  wte: (V_local, C)  wpe: (maxT, C) or undefined  y: (B, T, C), in wte's dtype
void embedding_shard_forward(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                             const Tensor& wpe, int64_t pos_offset) {
  constexpr const char* op = "embedding_shard_forward";
  check_forward(op, y, tokens, wte, wpe, pos_offset);
  check_vocab_begin(op, vocab_begin);
  backend_of(op, {{"y", y}, {"tokens", tokens}, {"wte", wte}, {"wpe", wpe}})
      .embedding_shard_forward(y, tokens, wte, vocab_begin, wpe, pos_offset);
}

// positions: (B, T) i32; their values are checked by the backend, which reads them.
void embedding_shard_forward_at(Tensor y, const Tensor& tokens, const Tensor& wte, int64_t vocab_begin,
                                const Tensor& wpe, const Tensor& positions) {
  constexpr const char* op = "embedding_shard_forward_at";
  check_forward(op, y, tokens, wte, wpe, std::nullopt);
  check_vocab_begin(op, vocab_begin);
  check_positions_operand(op, positions, tokens);
  backend_of(op, {{"y", y}, {"tokens", tokens}, {"wte", wte}, {"wpe", wpe}, {"positions", positions}})
      .embedding_shard_forward_at(y, tokens, wte, vocab_begin, wpe, positions);
}

// dy: (B, T, C) float  dwte: (V_local, C), dwpe: (maxT, C), each f32, bf16, f16 or undefined.
void embedding_shard_backward(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens, int64_t vocab_begin,
                              int64_t pos_offset) {
  constexpr const char* op = "embedding_shard_backward";
  check_backward(op, dwte, dwpe, dy, tokens, pos_offset);
  check_vocab_begin(op, vocab_begin);
  backend_of(op, {{"dwte", dwte}, {"dwpe", dwpe}, {"dy", dy}, {"tokens", tokens}})
      .embedding_shard_backward(dwte, dwpe, dy, tokens, vocab_begin, pos_offset);
}

// positions: (B, T) i32; their values are checked by the backend, which reads them.
void embedding_shard_backward_at(Tensor dwte, Tensor dwpe, const Tensor& dy, const Tensor& tokens,
                                 int64_t vocab_begin, const Tensor& positions) {
  constexpr const char* op = "embedding_shard_backward_at";
  check_backward(op, dwte, dwpe, dy, tokens, std::nullopt);
  check_vocab_begin(op, vocab_begin);
  check_positions_operand(op, positions, tokens);
  require_grads_apart(op, {{"dwte", dwte}, {"dwpe", dwpe}}, {{"positions", positions}});
  backend_of(op, {{"dwte", dwte}, {"dwpe", dwpe}, {"dy", dy}, {"tokens", tokens}, {"positions", positions}})
      .embedding_shard_backward_at(dwte, dwpe, dy, tokens, vocab_begin, positions);
}

}  // namespace loom::kernels
