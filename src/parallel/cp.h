// Context parallelism (DESIGN.md §5 CP): attention over sequences whose
// tokens are spread over the cp group. Every other layer works on a rank's
// own tokens; attention is the one that needs the others' keys and values,
// so CP is an AttentionStep (model/steps.h) the model runs its blocks with.
//
// The split (CpSplit): zig-zag cuts a sequence of T tokens into 2·cp chunks
// and gives rank r chunks r and 2·cp−1−r, in that order, so that every rank
// has the same causal work (an early chunk sees few keys, its partner many);
// without zig-zag rank r holds chunk r of cp, and the last rank does most.
//
// Two algorithms, the same arithmetic:
//   ring       K and V travel around the cp ring (send to r+1, receive from
//              r−1, the next block's transfer posted before the current
//              block is computed); each block's attention is merged into
//              the running result with the log-sum-exp rule
//              out = Σ exp(lseᵢ − lse)·outᵢ, lse = log Σ exp(lseᵢ). A block
//              wholly in the queries' future is skipped. Backward sends K
//              and V around again; dK and dV travel with them, each rank
//              adding its share, and reach their owner one hop after the
//              last block; dQ stays local.
//   allgather  K and V all-gathered once per layer, dK and dV
//              reduce-scattered in backward (Megatron's and Llama 3's choice
//              for GQA models, whose K/V are a fraction of Q).
// Each (query chunk, key chunk) pair is one call of the flash-attention
// kernel with the chunk's first position (kernels::attention_forward's
// q_pos); backward calls the kernel with the merged out and lse, which gives
// each block's share of the gradients exactly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "core/trace.h"
#include "model/steps.h"

namespace loom::parallel {

enum class CpAlgo : uint8_t { ring, allgather };
const char* cp_algo_name(CpAlgo a);
// "ring" or "allgather"; a loom::Error naming what is allowed otherwise.
CpAlgo cp_algo_from_name(std::string_view name);

// Consecutive global positions [start, start + length) of a sequence.
struct SeqChunk {
  int64_t start = 0, length = 0;
};

// How a sequence of T tokens is spread over cp ranks.
struct CpSplit {
  int cp = 1;
  bool zigzag = true;
  int64_t T = 0;  // the whole sequence

  int64_t chunk() const { return zigzag ? T / (2 * cp) : T / cp; }
  int64_t local_tokens() const { return T / cp; }
  // The rank's chunks, in the order its tensors hold them.
  std::vector<SeqChunk> segments(int rank) const;
  // The global position of the rank's local token t.
  int64_t position(int rank, int64_t t) const;
};
// T must divide by 2·cp (zig-zag) or cp: a loom::Error that says so.
CpSplit cp_split(int64_t T, int cp, bool zigzag);

class ContextParallelAttention final : public model::AttentionStep {
 public:
  // cp: the group (mesh.cp()), outliving this object. Buffers come from
  // pools (K/V blocks in flight: MemTag::comm; the rest: workspace) and live
  // for one call.
  ContextParallelAttention(comm::Communicator& cp, CpAlgo algo, bool zigzag, Pools& pools);

  // a.q, a.k, a.v: the rank's local_tokens() tokens of each sequence, in
  // segments() order; a.out, a.lse as LocalAttention's.
  void forward(const model::AttentionArgs& a) override;
  // g.dq (contiguous f32) += the rank's dQ; g.dk, g.dv (contiguous f32) +=
  // the gradients of the rank's own K and V from every rank's queries.
  void backward(const model::AttentionArgs& a, const model::AttentionGrads& g) override;

  CpSplit split(int64_t local_tokens) const { return cp_split(local_tokens * cp_.size(), cp_.size(), zigzag_); }
  CpAlgo algo() const { return algo_; }

  // The most bytes one call holds at once (from its pools' workspace and
  // comm tags: packed q, out, dout, the running result, K/V blocks in flight
  // and, in backward, dK/dV travelling), for B sequences of local_tokens
  // with NH query and NKV key/value heads of HS, compute the dtype of q, k,
  // v and out (gradients f32): what `loom bench train --cp` and
  // --memory-report add to the model's activations.
  static int64_t peak_bytes(int64_t B, int64_t local_tokens, int64_t NH, int64_t NKV, int64_t HS, DType compute,
                            int cp, CpAlgo algo, bool zigzag);
  // The same call's bytes by tag, forward and backward (a call is one or
  // the other: their peaks are never at once): what loom plan adds.
  struct CallBytes {
    int64_t forward_comm = 0, forward_workspace = 0, backward_comm = 0, backward_workspace = 0;
  };
  static CallBytes call_bytes(int64_t B, int64_t local_tokens, int64_t NH, int64_t NKV, int64_t HS, DType compute,
                              int cp, CpAlgo algo, bool zigzag);
  void set_trace(TraceRecorder* trace) { trace_ = trace; }

  // Since the last reset: seconds computing blocks, seconds waiting for
  // transfers (the communication compute did not hide), bytes sent, and the
  // kernel calls (blocks) each query chunk made.
  struct Stats {
    double compute_s = 0, wait_s = 0;
    int64_t bytes_sent = 0, blocks = 0;
  };
  const Stats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Call;
  void begin(Call& c, const model::AttentionArgs& a);
  void forward_blocks(Call& c, const Tensor& kv, int src);
  void backward_blocks(Call& c, const Tensor& kv, const Tensor& dkv, int src);
  void ring_forward(Call& c);
  void ring_backward(Call& c, const Tensor& dkv_own);
  void wait(const comm::WorkPtr& w);

  comm::Communicator& cp_;
  const CpAlgo algo_;
  const bool zigzag_;
  Pools& pools_;
  TraceRecorder* trace_ = nullptr;
  Stats stats_;
};

}  // namespace loom::parallel
