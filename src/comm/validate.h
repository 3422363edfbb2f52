// Checks of a communication call's arguments, shared by every backend: each
// failure is a loom::Error naming the op, the communicator and what is
// allowed.
#pragma once

#include <cstdint>
#include <span>
#include <string>

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

// "f32, 1000 elements" for messages.
std::string describe(const Tensor& t);

}  // namespace loom::comm
