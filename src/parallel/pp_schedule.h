// Pipeline schedules as data (DESIGN.md §5 PP): for each pipeline rank, the
// list of actions it runs in order — forward or backward of micro-batch m on
// one of its model chunks, and the sends and receives of activations and
// gradients between neighbouring stages. One runtime (later: pp_runtime)
// executes any such list; the generators and the simulator here are pure,
// so a schedule is tested as data before it ever runs.
//
// Stages and chunks. The model's layers are cut into pp x v chunks (stages
// 0 .. pp v - 1, in model order). Rank r holds v chunks: stage c pp + r for
// its local chunk c = 0 .. v - 1 (Megatron's virtual pipeline; v = 1 without
// interleaving). A micro-batch's forward runs stages 0, 1, ..., pp v - 1 and
// its backward the reverse; the activation of stage s goes to the rank of
// stage s + 1 (rank (r + 1) mod pp), its gradient back to the rank of s - 1.
//
// Generators:
//   afab         GPipe (Huang et al. 2019): all forwards, then all backwards.
//                Peak in-flight micro-batches per rank = m.
//   1f1b         PipeDream-Flush (Narayanan et al. 2021): pp - r - 1 warm-up
//                forwards, then alternate one forward / one backward, then
//                the cool-down backwards. Peak in-flight <= pp.
//   interleaved  Megatron's interleaved 1F1B over v chunks per rank: the same
//                pattern over micro-batch groups of pp, chunk order cycling
//                through the rank's chunks. Needs m a multiple of pp.
// In unit time (a chunk's forward and backward each take 1/v, transfers 0)
// the bubble fraction — idle time over busy time per rank — is (pp - 1) / m
// for afab and 1f1b and (pp - 1) / (v m) for interleaved.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom::parallel {

enum class PpScheduleKind : uint8_t { afab, one_f_one_b, interleaved };
std::string_view pp_schedule_name(PpScheduleKind k);  // "afab", "1f1b", "interleaved"
// Parses the names above; anything else is a loom::Error listing them.
PpScheduleKind pp_schedule_from_name(std::string_view name);

enum class PpOp : uint8_t { forward, backward, send_act, recv_act, send_grad, recv_grad };
std::string_view pp_op_name(PpOp op);

// One action of a rank. chunk: the rank's local chunk (0 .. v - 1) the
// action belongs to — for a send, the chunk whose output it sends; for a
// recv, the chunk whose input it receives. peer: the pipeline rank on the
// other side of a send / recv (-1 for forward / backward).
struct PpAction {
  PpOp op = PpOp::forward;
  int micro_batch = 0;
  int chunk = 0;
  int peer = -1;
  friend bool operator==(const PpAction&, const PpAction&) = default;
};
std::string to_string(const PpAction& a);  // "F m3 c1", "send_act m3 c1 -> 2", ...

// actions[r]: rank r's list. Every forward of a stage other than the first
// is preceded on its rank by the recv_act of its input, every forward of a
// stage other than the last is followed by the send_act of its output, and
// likewise for backward with recv_grad / send_grad (the last stage's
// backward needs no recv: the loss starts it).
struct PpSchedule {
  PpScheduleKind kind = PpScheduleKind::one_f_one_b;
  int pp = 1, micro_batches = 1, virtual_stages = 1;
  std::vector<std::vector<PpAction>> actions;
};

// pp >= 1 ranks, m >= 1 micro-batches, v >= 1 chunks per rank (v > 1 only
// for interleaved). Impossible requests are loom::Errors saying what is
// allowed: interleaved with m not a multiple of pp, or v < 2 for
// interleaved (use 1f1b), v > 1 for afab / 1f1b.
PpSchedule make_pp_schedule(PpScheduleKind kind, int pp, int micro_batches, int virtual_stages = 1);

// Runs a schedule in a simulated executor: each rank runs its actions in
// order; a forward or backward takes t_forward / t_backward (per chunk), a
// send never blocks and a recv waits until the matching send (same op pair,
// micro-batch, peer and stage) has been posted and the data has arrived
// (instantly). Reports what a real run would see.
struct PpSimulation {
  bool deadlock = false;       // some rank waits forever (or a send has no recv)
  std::string problem;         // why, naming the rank and action; empty when fine
  double makespan = 0;         // time the last rank finishes
  double busy = 0;             // per rank: the forwards' and backwards' time (equal on every rank)
  double bubble_fraction = 0;  // (makespan - busy) / busy
  std::vector<int> peak_in_flight;  // per rank: most micro-batches whose forward ran but not yet their backward, over its chunks (a micro-batch counts once per chunk)
};
PpSimulation simulate_pp_schedule(const PpSchedule& s, double t_forward = 1.0, double t_backward = 1.0);

// Where each action sits on its rank's list, by (op, micro-batch, stage),
// stage = chunk x pp + rank (-1: absent).
class PpPositions {
 public:
  PpPositions(int pp, int micro_batches, int virtual_stages);
  // Every action of s (a later duplicate overwrites an earlier one:
  // validate_pp_schedule reports duplicates).
  explicit PpPositions(const PpSchedule& s);
  int& at(PpOp op, int mb, int stage) { return at_[index(op, mb, stage)]; }
  int at(PpOp op, int mb, int stage) const { return at_[index(op, mb, stage)]; }
  // Rank r's action (op, mb, chunk).
  int of_rank(int r, PpOp op, int mb, int chunk) const { return at(op, mb, chunk * pp_ + r); }
  // The send on the neighbour that recv `a` of `rank` receives, and the
  // recv on the neighbour that send `a` of `rank` reaches.
  int sender(int rank, const PpAction& a) const;
  int receiver(int rank, const PpAction& a) const;

 private:
  size_t index(PpOp op, int mb, int stage) const {
    return static_cast<size_t>((static_cast<int>(op) * m_ + mb) * stages_ + stage);
  }
  int pp_ = 1, m_ = 1, stages_ = 1;
  std::vector<int> at_;
};

// Structural checks that need no timing: every send has exactly one
// matching recv on its peer and vice versa; each (micro-batch, stage) has
// exactly one forward and one backward, on the stage's rank, the forward
// before the backward, and stage order respected on each rank. Returns ""
// if the schedule is well formed, else the first problem found.
std::string validate_pp_schedule(const PpSchedule& s);

}  // namespace loom::parallel
