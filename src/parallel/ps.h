// Parameter-server training, the worker's side and the wire protocol
// (DESIGN.md §5 PS; the servers' loop is train/ps_server.h).
//
// The job's world is split: ranks 0..S-1 are servers, ranks S..S+W-1 the W
// workers (parallel.dp of them), each a whole model replica training on its
// slice of every global batch, as a data-parallel rank does. Parameters are
// laid out in the buckets data parallelism uses (parallel/dp_layout.h,
// stage 0: whole units merged in backward's order up to bucket_mb; under
// optimizer servers one bucket per unit, their ZeRO-3 layout), and every
// bucket is split over the servers by comm::shard_range, so each server
// holds a balanced share of every bucket's bytes.
//
// Every message goes over the world communicator (point to point, so it
// runs on the communicator's progress thread while backward computes and
// falls under its watchdog). Per step, each worker sends each server
//   a command  i64[4] {kStep, step, data position, 0}
//   then, as backward finishes each bucket (DataParallel's grads_ready,
//   through GradientExchange), the server's piece of its f32 gradients.
// A summation server (kind sum, BytePS) adds each bucket's pieces over the
// workers in worker order and sends the sum back at once; the worker divides
// by W: the average an all-reduce would give, and the worker's own AdamW
// applies it. An optimizer server (kind optimizer, ps-lite) sums and
// averages the same way, then, with every bucket in, takes the global
// gradient norm over the servers, applies AdamW to its shard of the f32
// master weights and sends back i64[2] {norm bits, skipped} and its piece
// of every bucket's updated weights; the worker keeps no optimizer step.
//
// Asynchronous (staleness s > 0, optimizer servers; SSP): a worker's
// commands go to server 0 alone, which orders the servers' work: as each
// worker's push is complete (its pieces, then i64[2] {kTagDone: step, 0}
// once its sends finished) it broadcasts an event over the servers'
// communicator (i64[4]: apply a push, drop a lost worker, save, a worker
// stopped, end), so every server applies the same pushes in the same order.
// A push is applied alone, as it arrives: AdamW on the worker's own
// gradient, clipped by its own global norm, at the learning rate of the
// step it was computed at. A worker that pushed step k gets its reply (the
// result, then the weights) once every live worker has pushed at least
// k + 1 - s steps: it never runs more than s steps ahead of the slowest.
// A worker from which server 0 hears nothing for parallel.timeout_s / 2
// while it holds others back is dropped: its posted receives are cancelled
// (Communicator::recv_unguarded), the log names it, and the rest go on.
// The reply's i64[4] {norm bits, skipped, workers lost, slowest worker's
// pushes} tells the workers (comm::note_lost_peer) so the job's end does not
// wait for the lost rank.
//
// Other commands: kResume (i64[4] {kResume, 0, 0, path bytes} + the step
// dir's path as i32 bytes: the servers load the checkpoint the workers
// chose, or start fresh), kSave (the servers write the checkpoint and send
// i64[1] back from server 0), kStop (the run is over; servers leave).
// On connecting, each worker sends each server i64[4] {kProtocol, kind, W,
// buckets} and the bucket sizes i64[buckets]; a server checks that every
// worker agrees with it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/memory.h"
#include "parallel/dp_layout.h"

namespace loom::parallel {

enum class PsKind : int64_t { sum = 0, optimizer = 1 };
PsKind ps_kind_from_name(const std::string& name);  // "sum", "optimizer"; loom::Error otherwise
const char* ps_kind_name(PsKind kind);

namespace ps {
inline constexpr int64_t kProtocol = 1;
// Message tags on the world communicator; bucket b's gradients (worker to
// server) and its sum or weights (server to worker) go under kTagBucket + b.
inline constexpr int kTagHello = 11, kTagLayout = 12, kTagCommand = 13, kTagInfo = 16, kTagPath = 17,
                     kTagReply = 18, kTagDone = 19, kTagBucket = 1000;
inline constexpr int kMaxBuckets = 30000;  // kTagBucket + b stays below MPI's smallest tag bound (32767)
enum Command : int64_t { kStep = 1, kResume = 2, kSave = 3, kStop = 4 };
// The world ranks of a job of `servers` servers: server s is rank s, worker w rank servers + w.
inline int server_rank(int s) { return s; }
inline int worker_rank(int servers, int w) { return servers + w; }
}  // namespace ps

// Where stage-0 data parallelism sends a bucket's gradients instead of
// all-reducing them over its group (DpOptions::exchange).
class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  // Bucket b's gradients (its elements, in the model's flat buffer); the
  // returned Work completes when the exchange is done with them (and for
  // summation servers they then hold the workers' average).
  virtual comm::WorkPtr exchange(int bucket, Tensor grads) = 0;
  // Before the model reads bucket b's weights: waits for them if they are
  // still arriving. Default: nothing.
  virtual void params_needed(int /*bucket*/) {}
};

// What an optimizer server's step gave back.
struct PsStepResult {
  double grad_norm = 0;  // global, before clipping
  bool skipped = false;  // the update was not applied (a non-finite norm)
  int64_t lost = 0;      // workers dropped from the run so far (asynchronous)
  int64_t slowest = 0;   // the fewest pushes any live worker had made when the reply left (asynchronous)
};

class PsWorker final : public GradientExchange {
 public:
  // world: the whole job; this process is worker `worker` of `workers`, the
  // servers are world ranks 0..servers-1. buckets: this worker's stage-0
  // buckets (DataParallel::buckets()). Sends the hello and the layout.
  // staleness > 0: asynchronous (optimizer servers only).
  PsWorker(comm::Communicator& world, int servers, int workers, int worker, PsKind kind, int64_t staleness,
           std::vector<Bucket> buckets, Pools& pools);
  ~PsWorker() override;
  PsWorker(const PsWorker&) = delete;
  PsWorker& operator=(const PsWorker&) = delete;

  PsKind kind() const { return kind_; }
  int servers() const { return servers_; }
  int workers() const { return workers_; }
  int worker() const { return worker_; }
  bool asynchronous() const { return staleness_ > 0; }

  // Before a step's backward: tells every server that step `step` (0-based)
  // with the data at `position` is coming.
  void begin_step(int64_t step, int64_t position);
  comm::WorkPtr exchange(int bucket, Tensor grads) override;
  // Optimizer servers: waits for the step's result and posts the receives
  // of every bucket's updated weights into params (the model's flat f32
  // buffer): the next forward waits for each bucket as it reaches it
  // (params_needed), so the later buckets arrive while the first layers
  // compute.
  PsStepResult pull(Tensor params);
  void params_needed(int bucket) override;
  // Waits for every bucket's weights (anything reading them outside forward).
  void wait_params();
  // The servers load the step dir `path` ("" : start fresh).
  void resume(const std::string& path);
  // The servers write a checkpoint of their state as of step `step` with
  // the data at `position` (this worker's); returns once they have.
  void save(int64_t step, int64_t position);
  // The run is over (every worker says so; a server leaves once all have).
  void stop();

  // Bytes this worker sent and received since the last reset (the benchmark).
  int64_t bytes_sent() const { return sent_; }
  int64_t bytes_received() const { return received_; }
  void reset_bytes() { sent_ = received_ = 0; }

 private:
  void command(int64_t cmd, int64_t a, int64_t b, int64_t c);
  // Sends buf to servers 0..servers-1 under tag and waits for the sends.
  void send_to_servers(Tensor buf, int servers, int tag);
  // The servers a command goes to: all (synchronous), or server 0.
  int command_servers() const { return asynchronous() ? 1 : servers_; }
  // Test and benchmark instrumentation (environment): LOOM_PS_EVENTS = dir
  // appends one JSON line per step to dir/worker_<w>.jsonl: step, and
  // wall-clock seconds at its start (after a straggler's delay:
  // train/trainer.h LOOM_DP_DELAY), when its push was sent, when its reply
  // arrived, and the reply's slowest.
  void read_instrumentation();
  void record(int64_t step, const PsStepResult& r);
  comm::Communicator& world_;
  int servers_, workers_, worker_;
  PsKind kind_;
  std::vector<Bucket> buckets_;
  Pools& pools_;
  int64_t staleness_;
  std::string events_path_;
  double begun_ = 0, pushed_at_ = 0;
  int64_t step_ = 0;
  // Optimizer servers: the buckets pushed this step, in push order, and per
  // bucket the receives of its weights still pending.
  std::vector<int> pushed_;
  std::vector<std::vector<comm::WorkPtr>> arriving_;
  int64_t sent_ = 0, received_ = 0;
};

}  // namespace loom::parallel
