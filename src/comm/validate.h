// Checks of a communication call's arguments, shared by every backend: each
// failure is a loom::Error naming the op, the communicator and what is
// allowed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"

namespace loom::comm {

struct CallSite {
  const char* op;            // "all_reduce"
  const std::string& comm;   // the communicator's name
  int size;
  Device device;
};

// A defined, contiguous tensor of f32, bf16, i32 or i64 on the communicator's device.
void validate_buffer(const CallSite& at, const char* arg, const Tensor& t);
// avg needs a float dtype: an integer average would truncate.
void validate_reduce_op(const CallSite& at, DType dtype, ReduceOp op);
void validate_same_dtype(const CallSite& at, const Tensor& out, const Tensor& in);
void validate_peer(const CallSite& at, const char* arg, int peer);
// In place: `shard` is exactly elements [own.offset, own.offset + own.count)
// of `whole` (same dtype, non-empty). reduce_scatter (shard = out) and
// all_gather (shard = in) accept that aliasing and reject any other overlap.
bool is_own_shard(const Tensor& whole, const Tensor& shard, Range own);
void validate_reduce_scatter(const CallSite& at, int rank, const Tensor& out, const Tensor& in, ReduceOp op);
void validate_all_gather(const CallSite& at, int rank, const Tensor& out, const Tensor& in);
void validate_all_to_all(const CallSite& at, const Tensor& out, const Tensor& in);
void validate_all_to_all_v(const CallSite& at, const Tensor& out, std::span<const int64_t> out_counts,
                           const Tensor& in, std::span<const int64_t> in_counts);
// check_collectives for all_to_all_v, where ranks pass different counts:
// every rank contributes count_words(in_counts, out_counts) to an all-gather
// (rank order), then all_to_all_v_counts_agree throws the same message on
// every rank unless rank i's in_counts[j] is rank j's out_counts[i] for
// every pair. `label` names the call ("all_to_all_v(...) #3 on communicator 'ep'").
std::vector<int64_t> count_words(std::span<const int64_t> in_counts, std::span<const int64_t> out_counts);
void all_to_all_v_counts_agree(const std::string& label, int size, std::span<const int64_t> all_words);

// "f32, 1000 elements" for messages.
std::string describe(const Tensor& t);

}  // namespace loom::comm
