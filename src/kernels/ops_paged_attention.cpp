// Paged attention (ops.h): operand checks, then the backend's op. The values
// (slots, block tables, lengths) are checked by the backend, which reads them.
#include "kernels/dispatch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

// k_cache, v_cache: (NB, BS, NKV, HS) contiguous, one float dtype, apart.
void check_caches(const char* op, const Tensor& k_cache, const Tensor& v_cache) {
  require_contiguous(op, {{"k_cache", k_cache}, {"v_cache", v_cache}});
  require_ndim(op, {"k_cache", k_cache}, 4);
  require_float(op, {"k_cache", k_cache});
  require_dtype(op, {"v_cache", v_cache}, k_cache.dtype());
  require_same_shape(op, {"k_cache", k_cache}, {"v_cache", v_cache});
  if (k_cache.size(1) < 1) op_fail(op, {{"k_cache", k_cache}}, "the block size (dim 1) must be at least 1");
  if (k_cache.size(3) < 1) op_fail(op, {{"k_cache", k_cache}}, "head size must be at least 1");
  require_no_overlap(op, {"v_cache", v_cache}, {"k_cache", k_cache});
}

// i32 index operands of paged_attention_forward: block_tables (S, max_blocks),
// seq_lens (S), query_start (S + 1).
void check_batch_layout(const char* op, const Tensor& block_tables, const Tensor& seq_lens,
                        const Tensor& query_start) {
  const std::initializer_list<Operand> all = {
      {"block_tables", block_tables}, {"seq_lens", seq_lens}, {"query_start", query_start}};
  require_contiguous(op, all);
  for (const Operand& o : all) require_dtype(op, o, DType::i32);
  require_ndim(op, {"block_tables", block_tables}, 2);
  require_ndim(op, {"seq_lens", seq_lens}, 1);
  require_ndim(op, {"query_start", query_start}, 1);
  const int64_t S = block_tables.size(0);
  if (seq_lens.size(0) != S)
    op_fail(op, all, "seq_lens has ", seq_lens.size(0), " sequences but block_tables has ", S);
  if (query_start.size(0) != S + 1)
    op_fail(op, all, "query_start must have S + 1 = ", S + 1, " entries, got ", query_start.size(0));
}

}  // namespace

// k, v: (N, NKV, HS)  slots: (N) i64  caches: (NB, BS, NKV, HS)
void kv_cache_write(Tensor k_cache, Tensor v_cache, const Tensor& k, const Tensor& v, const Tensor& slots) {
  constexpr const char* op = "kv_cache_write";
  const std::initializer_list<Operand> all = {
      {"k_cache", k_cache}, {"v_cache", v_cache}, {"k", k}, {"v", v}, {"slots", slots}};
  check_caches(op, k_cache, v_cache);
  require_contiguous(op, {{"k", k}, {"v", v}, {"slots", slots}});
  require_ndim(op, {"k", k}, 3);
  require_float(op, {"k", k});
  require_dtype(op, {"v", v}, k.dtype());
  require_same_shape(op, {"k", k}, {"v", v});
  require_dtype(op, {"slots", slots}, DType::i64);
  require_shape(op, {"slots", slots}, Shape{k.size(0)});
  if (k.size(1) != k_cache.size(2) || k.size(2) != k_cache.size(3))
    op_fail(op, all, "k has (", k.size(1), " kv heads, head size ", k.size(2), ") but the caches hold (",
            k_cache.size(2), ", ", k_cache.size(3), ")");
  for (const Operand& in : {Operand{"k", k}, Operand{"v", v}, Operand{"slots", slots}}) {
    require_no_overlap(op, {"k_cache", k_cache}, in);
    require_no_overlap(op, {"v_cache", v_cache}, in);
  }
  backend_of(op, all).kv_cache_write(k_cache, v_cache, k, v, slots);
}

// out, q: (N, NH, HS)  caches: (NB, BS, NKV, HS)  block_tables: (S, max_blocks)
// seq_lens: (S)  query_start: (S + 1), all i32
void paged_attention_forward(Tensor out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& block_tables, const Tensor& seq_lens, const Tensor& query_start) {
  constexpr const char* op = "paged_attention_forward";
  const std::initializer_list<Operand> all = {{"out", out},           {"q", q},
                                              {"k_cache", k_cache},   {"v_cache", v_cache},
                                              {"block_tables", block_tables}, {"seq_lens", seq_lens},
                                              {"query_start", query_start}};
  check_caches(op, k_cache, v_cache);
  check_batch_layout(op, block_tables, seq_lens, query_start);
  require_contiguous(op, {{"out", out}, {"q", q}});
  require_ndim(op, {"q", q}, 3);
  require_float(op, {"q", q});
  require_dtype(op, {"out", out}, q.dtype());
  require_shape(op, {"out", out}, q.shape());
  const int64_t NH = q.size(1), HS = q.size(2), NKV = k_cache.size(2);
  if (k_cache.size(3) != HS)
    op_fail(op, all, "q has head size ", HS, " but the caches have head size ", k_cache.size(3));
  if (NKV < 1 || NH % NKV != 0)
    op_fail(op, all, "q has ", NH, " heads, not a multiple of the ", NKV, " kv heads of the caches");
  for (const Operand& in : {Operand{"q", q}, Operand{"k_cache", k_cache}, Operand{"v_cache", v_cache}})
    require_no_overlap(op, {"out", out}, in);
  backend_of(op, all).paged_attention_forward(out, q, k_cache, v_cache, block_tables, seq_lens, query_start);
}

}  // namespace loom::kernels
