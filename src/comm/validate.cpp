#include "comm/validate.h"

#include <numeric>

#include "core/error.h"

namespace loom::comm {
namespace {

std::string where(const CallSite& at) { return concat(at.op, " on communicator '", at.comm, "': "); }

// The only overlap MPI and NCCL allow between a shard and its whole buffer is
// the exact in-place one: anything else would read what is being written.
void validate_shard_overlap(const CallSite& at, int rank, const Tensor& whole, const char* whole_name,
                            const Tensor& shard, const char* shard_name) {
  const Range own = shard_range(whole.numel(), at.size, rank);
  if (shard.numel() == 0 || whole.numel() == 0 || is_own_shard(whole, shard, own)) return;
  const auto* w = static_cast<const std::byte*>(whole.data());
  const auto* s = static_cast<const std::byte*>(shard.data());
  const size_t wb = static_cast<size_t>(whole.numel()) * dtype_size(whole.dtype());
  const size_t sb = static_cast<size_t>(shard.numel()) * dtype_size(shard.dtype());
  const bool overlap = s < w + wb && w < s + sb;
  LOOM_REQUIRE(!overlap, where(at), shard_name, " overlaps ", whole_name, " but is not rank ", rank,
               "'s own range of it (elements ", own.offset, "..", own.offset + own.count,
               "): pass disjoint buffers, or exactly that range for in place");
}

}  // namespace

bool is_own_shard(const Tensor& whole, const Tensor& shard, Range own) {
  if (shard.numel() == 0 || shard.numel() != own.count || shard.dtype() != whole.dtype()) return false;
  return shard.data() ==
         static_cast<const std::byte*>(whole.data()) + static_cast<size_t>(own.offset) * dtype_size(whole.dtype());
}

std::string describe(const Tensor& t) { return concat(dtype_name(t.dtype()), ", ", t.numel(), " elements"); }

void validate_buffer(const CallSite& at, const char* arg, const Tensor& t) {
  LOOM_REQUIRE(t.defined() && (t.data() != nullptr || t.numel() == 0), where(at), arg, " is an undefined tensor");
  const DType d = t.dtype();
  LOOM_REQUIRE(d == DType::f32 || d == DType::bf16 || d == DType::i32 || d == DType::i64, where(at), arg,
               " has dtype ", dtype_name(d), ": allowed dtypes are f32, bf16, i32, i64");
  LOOM_REQUIRE(t.is_contiguous(), where(at), arg, " ", t.str(), " is not contiguous: pass a contiguous tensor");
  LOOM_REQUIRE(t.device() == at.device, where(at), arg, " is on ", device_name(t.device()),
               " but the communicator works on ", device_name(at.device));
}

void validate_reduce_op(const CallSite& at, DType dtype, ReduceOp op) {
  LOOM_REQUIRE(op != ReduceOp::avg || dtype_is_float(dtype), where(at), "avg of ", dtype_name(dtype),
               " would truncate: avg needs f32 or bf16 (use sum and divide)");
}

void validate_same_dtype(const CallSite& at, const Tensor& out, const Tensor& in) {
  LOOM_REQUIRE(out.dtype() == in.dtype(), where(at), "out is ", dtype_name(out.dtype()), " but in is ",
               dtype_name(in.dtype()), ": they must have the same dtype");
}

void validate_peer(const CallSite& at, const char* arg, int peer) {
  LOOM_REQUIRE(peer >= 0 && peer < at.size, where(at), arg, " ", peer, " is out of range: allowed 0..", at.size - 1);
}

void validate_reduce_scatter(const CallSite& at, int rank, const Tensor& out, const Tensor& in, ReduceOp op) {
  validate_buffer(at, "out", out);
  validate_buffer(at, "in", in);
  validate_same_dtype(at, out, in);
  validate_reduce_op(at, in.dtype(), op);
  const Range r = shard_range(in.numel(), at.size, rank);
  LOOM_REQUIRE(out.numel() == r.count, where(at), "out has ", out.numel(), " elements but rank ", rank,
               "'s shard of ", in.numel(), " over ", at.size, " ranks is ", r.count, " (shard_range)");
  validate_shard_overlap(at, rank, in, "in", out, "out");
}

void validate_all_gather(const CallSite& at, int rank, const Tensor& out, const Tensor& in) {
  validate_buffer(at, "out", out);
  validate_buffer(at, "in", in);
  validate_same_dtype(at, out, in);
  const Range r = shard_range(out.numel(), at.size, rank);
  LOOM_REQUIRE(in.numel() == r.count, where(at), "in has ", in.numel(), " elements but rank ", rank, "'s shard of ",
               out.numel(), " over ", at.size, " ranks is ", r.count, " (shard_range)");
  validate_shard_overlap(at, rank, out, "out", in, "in");
}

void validate_all_to_all(const CallSite& at, const Tensor& out, const Tensor& in) {
  validate_buffer(at, "out", out);
  validate_buffer(at, "in", in);
  validate_same_dtype(at, out, in);
  LOOM_REQUIRE(out.numel() == in.numel() && in.numel() % at.size == 0, where(at), "in has ", in.numel(),
               " and out ", out.numel(), " elements: both must hold ", at.size, " equal blocks");
}

void validate_all_to_all_v(const CallSite& at, const Tensor& out, std::span<const int64_t> out_counts,
                           const Tensor& in, std::span<const int64_t> in_counts) {
  validate_buffer(at, "out", out);
  validate_buffer(at, "in", in);
  validate_same_dtype(at, out, in);
  for (auto [arg, counts, t] : {std::tuple{"in_counts", in_counts, &in}, std::tuple{"out_counts", out_counts, &out}}) {
    LOOM_REQUIRE(counts.size() == static_cast<size_t>(at.size), where(at), arg, " has ", counts.size(),
                 " entries: it needs one per rank (", at.size, ")");
    for (size_t i = 0; i < counts.size(); ++i)
      LOOM_REQUIRE(counts[i] >= 0, where(at), arg, "[", i, "] = ", counts[i], " is negative");
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    LOOM_REQUIRE(total == t->numel(), where(at), arg, " sum to ", total, " but the tensor has ", t->numel(),
                 " elements");
  }
}

std::vector<int64_t> count_words(std::span<const int64_t> in_counts, std::span<const int64_t> out_counts) {
  std::vector<int64_t> words(in_counts.begin(), in_counts.end());
  words.insert(words.end(), out_counts.begin(), out_counts.end());
  return words;
}

void all_to_all_v_counts_agree(const std::string& label, int size, std::span<const int64_t> all_words) {
  const auto n = static_cast<size_t>(size);
  LOOM_CHECK(all_words.size() == 2 * n * n, "all_to_all_v_counts_agree: ", all_words.size(), " words for ", size,
             " ranks");
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) {
      const int64_t sends = all_words[2 * n * i + j];        // rank i's in_counts[j]
      const int64_t expects = all_words[2 * n * j + n + i];  // rank j's out_counts[i]
      LOOM_REQUIRE(sends == expects, "check_collectives: ", label, ": rank ", i, " sends ", sends,
                   " elements to rank ", j, " (in_counts[", j, "]) but rank ", j, " expects ", expects,
                   " from rank ", i, " (out_counts[", i, "])");
    }
}

}  // namespace loom::comm
