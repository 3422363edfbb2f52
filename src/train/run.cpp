// loom train's run: the loop around Trainer::step (train/trainer.h) with
// everything that keeps a run's work safe (issue 15): outputs probed and
// locked before the first step, resume (train/checkpoint_dir.h), progress and
// metrics, checkpoints, the divergence guard, SIGTERM / SIGINT, the final
// model written before the trace.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "comm/host_values.h"
#include "core/atomic_file.h"
#include "core/dir_lock.h"
#include "core/error.h"
#include "core/log.h"
#include "core/stop_signal.h"
#include "kernels/cpu_isa.h"
#include "kernels/op_trace.h"
#include "model/config_json.h"
#include "train/checkpoint_dir.h"
#include "train/run_outputs.h"
#include "train/trainer.h"

namespace loom::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string format_duration(double s) {
  const auto total = static_cast<int64_t>(std::max(0.0, s));
  char buf[32];
  if (total >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(total / 3600),
                  static_cast<long long>(total / 60 % 60));
  else
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(total / 60), static_cast<long long>(total % 60));
  return buf;
}

// The progress line, the metrics file and the summary of a run.
class Reporter {
 public:
  // first_step: the steps done before this run (a resumed run appends to the
  // metrics file and estimates its ETA from its own steps).
  Reporter(const RunConfig& cfg, const TrainOptions& options, double flops_per_token, double peak_flops,
           int64_t first_step)
      : cfg_(cfg), options_(options), flops_per_token_(flops_per_token), peak_flops_(peak_flops),
        first_step_(first_step) {
    path_ = options.metrics_path.empty() ? cfg.log.metrics : options.metrics_path;
    if (!path_.empty()) {
      if (first_step > 0) keep_records_up_to(path_, first_step);
      metrics_.open(path_, first_step > 0 ? std::ios::app : std::ios::trunc);
      LOOM_REQUIRE(metrics_.good(), "cannot write the metrics file '", path_, "'");
    }
  }

  void initial_eval(double val_loss) {
    if (options_.progress) log_info("step 0/", cfg_.train.steps, " | val loss ", fixed(val_loss, 4));
    if (metrics_.is_open()) write({{"step", 0}, {"val_loss", val_loss}});
  }

  void step(const StepStats& s, double elapsed, size_t peak_bytes) {
    const double tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
    // tokens_per_s counts every dp rank; peak_flops is one rank's (of dp x tp).
    const double mfu =
        flops_per_token_ * tokens_per_s / (peak_flops_ * cfg_.parallel.dp * cfg_.parallel.tp * cfg_.parallel.pp);
    if (metrics_.is_open()) {
      nlohmann::ordered_json j = {{"step", s.step},           {"loss", s.loss}, {"lr", s.lr},
                                  {"grad_norm", s.grad_norm}, {"tokens_per_s", tokens_per_s}, {"mfu", mfu}};
      if (s.loss_scale > 0) j["loss_scale"] = s.loss_scale, j["skipped"] = s.skipped;
      if (s.val_loss) j["val_loss"] = *s.val_loss;
      if (s.disk) j["disk_wait_s"] = s.disk->wait_seconds, j["disk_update_s"] = s.disk->update_seconds,
                  j["disk_bytes"] = s.disk->bytes;
      if (s.moe) {
        j["aux_loss"] = s.moe->aux_loss, j["z_loss"] = s.moe->z_loss;
        j["expert_load_min"] = s.moe->load_min, j["expert_load_max"] = s.moe->load_max;
        j["dropped"] = s.moe->dropped;
      }
      write(j);
    }
    if (s.skipped && options_.progress)
      log_warn("step ", s.step, ": gradients overflowed at loss scale ", s.loss_scale,
               ": update skipped, loss scale halved");
    if (!options_.progress || (s.step % cfg_.log.every != 0 && s.step != cfg_.train.steps && !s.val_loss)) return;
    const double eta =
        elapsed / static_cast<double>(s.step - first_step_) * static_cast<double>(cfg_.train.steps - s.step);
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %lld/%lld | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | MFU %.1f%% | mem %.0f MiB | "
                  "ETA %s",
                  static_cast<long long>(s.step), static_cast<long long>(cfg_.train.steps), s.loss, s.lr, s.grad_norm,
                  tokens_per_s, 100.0 * mfu, static_cast<double>(peak_bytes) / (1024.0 * 1024.0), format_duration(eta).c_str());
    std::string text = line;
    if (s.loss_scale > 0) text += concat(" | loss scale ", s.loss_scale, s.skipped ? " (skipped)" : "");
    if (s.moe)
      text += concat(" | aux ", fixed(s.moe->aux_loss, 3), " z ", fixed(s.moe->z_loss, 2), " | load ",
                     fixed(s.moe->load_min, 2), "-", fixed(s.moe->load_max, 2), " | dropped ",
                     fixed(100.0 * s.moe->dropped, 1), "%");
    if (s.disk)
      text += concat(" | disk ", fixed(static_cast<double>(s.disk->bytes) / 1e9, 2), " GB, waited ",
                     fixed(s.disk->wait_seconds, 2), " s, update ", fixed(s.disk->update_seconds, 2), " s");
    if (s.val_loss) text += " | val loss " + fixed(*s.val_loss, 4);
    log_info(text);
  }

 private:
  // A resumed run's metrics file loses the records past the step it resumed
  // from (written after that checkpoint by a run that then died), so that
  // every step appears once, as in an uninterrupted run's file.
  static void keep_records_up_to(const std::string& path, int64_t step) {
    std::ifstream in(path);
    if (!in) return;
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      // A line cut short by the crash does not parse: dropped too.
      const bool later = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                         j["step"].get<int64_t>() > step;
      if (j.is_discarded() || later) {
        dropped = true;
        continue;
      }
      kept += line + "\n";
    }
    if (dropped) write_file_atomic(path, kept);
  }
  static std::string fixed(double v, int digits) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", digits, v);
    return buf;
  }
  // A record the disk did not take stops the run (its checkpoints keep
  // what was trained) rather than leave a metrics file cut short unsaid.
  void write(const nlohmann::ordered_json& j) {
    errno = 0;
    metrics_ << j.dump() << "\n";
    metrics_.flush();
    LOOM_REQUIRE(metrics_.good(), "cannot write the metrics file '", path_, "' at step ", j.value("step", 0), ": ",
                 errno != 0 ? std::strerror(errno) : "the write failed", " (its last record may be cut short)");
  }

  const RunConfig& cfg_;
  const TrainOptions& options_;
  double flops_per_token_;
  double peak_flops_;
  int64_t first_step_;
  std::string path_;
  std::ofstream metrics_;
};

void world_barrier(Trainer& t) { t.mesh().world().barrier()->wait(); }

// Null without log.trace. The barrier gives every rank the same start, so
// their tracks line up in the merged file; a rank's track is its world rank.
// Collective over the mesh.
std::unique_ptr<TraceRecorder> start_trace(const RunConfig& cfg, Trainer& t) {
  if (cfg.log.trace.empty()) return nullptr;
  world_barrier(t);
  const int pid = t.mesh().world_rank();
  return std::make_unique<TraceRecorder>(pid, concat("rank ", pid));
}

// A single process writes log.trace itself; on a grid each rank writes
// path.rank<pid>, and after a barrier rank 0 merges them into path and
// removes them. Collective over the mesh.
void finish_trace(const std::string& path, Trainer& t, const TraceRecorder& trace) {
  const int ranks = t.mesh().world_size();
  if (ranks == 1) return write_file_atomic(path, trace_document(trace.jsonl()));
  write_file_atomic(concat(path, ".rank", trace.pid()), trace.jsonl());
  world_barrier(t);
  if (trace.pid() != 0) return;
  std::string all;
  for (int r = 0; r < ranks; ++r) {
    const std::string part = concat(path, ".rank", r);
    std::ifstream in(part);
    LOOM_REQUIRE(in.good(), "cannot read the trace part '", part,
                 "': log.trace must be on a file system every rank sees");
    all.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  write_file_atomic(path, trace_document(all));
  for (int r = 0; r < ranks; ++r) std::filesystem::remove(concat(path, ".rank", r));
}

// log.trace_ops: the ops timed into the trace (null without it).
std::unique_ptr<kernels::OpTracer> start_op_trace(const RunConfig& cfg, TraceRecorder* trace) {
  return trace && cfg.log.trace_ops ? std::make_unique<kernels::OpTracer>(*trace) : nullptr;
}

// The trainer records no more spans, and log.trace_ops its last: the ops'
// table is printed with the lead rank's progress (each rank's ops are in its
// track of the trace), and the ops run untimed from here on.
void stop_tracing(Trainer& t, std::unique_ptr<kernels::OpTracer>& ops, bool print) {
  t.set_trace(nullptr);
  if (!ops) return;
  if (print) log_info("train: the kernel ops so far (log.trace_ops; this rank's):\n", ops->table());
  ops.reset();
}

// A parameter-server worker's end (train/ps_server.h): the lead reports its
// bytes per step, then the servers are told it is done.
void finish_ps_worker(Trainer& t, int64_t steps_run, bool lead) {
  if (lead && steps_run > 0)
    log_info("ps: worker 0 sent ", static_cast<double>(t.ps()->bytes_sent()) / steps_run / (1 << 20),
             " MiB and received ", static_cast<double>(t.ps()->bytes_received()) / steps_run / (1 << 20),
             " MiB per step");
  t.ps()->stop();
}

// The largest signal number any rank received (0: none), so that every rank
// stops after the same step. Collective over the mesh.
int agree_on_stop(Trainer& t, int signal) {
  comm::Communicator& world = t.mesh().world();
  if (world.size() == 1 || t.asynchronous()) return signal;  // asynchronous workers stop on their own
  float v = static_cast<float>(signal);
  comm::all_reduce_host(world, Tensor(&v, DType::f32, {1}), comm::ReduceOp::max);
  return static_cast<int>(v);
}

std::string describe_bad_step(const StepStats& s) {
  if (!std::isfinite(s.loss) || !std::isfinite(s.grad_norm))
    return concat("loss ", s.loss, ", grad norm ", s.grad_norm);
  return concat("gradients overflow at the loss scale floor ", s.loss_scale, " (train.min_loss_scale)");
}

}  // namespace

namespace {

// --memory-report: every rank's own table (under ZeRO each holds its shard)
// and what its activations and cp buffers are predicted to be.
void print_memory_report(Trainer& trainer, Pools& pools, int64_t budget_bytes) {
  mesh::Mesh& m = trainer.mesh();
  const std::string more = (m.cp().size() > 1 ? concat(", cp rank ", m.cp().rank(), "/", m.cp().size()) : "") +
                           (trainer.tp_size() > 1 ? concat(", tp rank ", trainer.tp_rank(), "/", trainer.tp_size()) : "") +
                           (trainer.pp_size() > 1 ? concat(", pp rank ", trainer.pp_rank(), "/", trainer.pp_size()) : "");
  std::printf("%s",
              concat("[rank ", m.dp().rank(), "/", m.dp().size(), more, "]\n", pools.report().table()).c_str());
  std::printf("%s\n", recompute_report(trainer.model(), pools.report()).c_str());
  std::printf("%s\n", activation_prediction_report(trainer.model()).c_str());
  if (const parallel::ContextParallelAttention* cp = trainer.cp())
    std::printf("%s\n", cp_buffers_report(trainer.model(), *cp).c_str());
  std::printf("process resident (/proc/self/status): now %.1f MiB, peak %.1f MiB%s\n",
              static_cast<double>(process_resident_bytes()) / (1 << 20),
              static_cast<double>(process_peak_resident_bytes()) / (1 << 20),
              budget_bytes > 0 ? concat(" of the budget ", static_cast<double>(budget_bytes) / (1 << 20), " MiB").c_str()
                               : "");
}

// --memory-budget-mb, after each step: what the OS counts, not only loom's
// buffers.
void check_memory_budget(int64_t budget_bytes, int64_t step, const std::string& newest) {
  if (budget_bytes <= 0) return;
  const int64_t peak = process_peak_resident_bytes();
  LOOM_REQUIRE(peak <= budget_bytes, "train: after step ", step, " this process's peak resident memory (VmHWM) is ",
               static_cast<double>(peak) / (1 << 20), " MiB, over --memory-budget-mb = ",
               static_cast<double>(budget_bytes) / (1 << 20), ": stopped; the newest checkpoint is ",
               newest.empty() ? "none" : newest, ". Offload more (parallel.offload), shard over more ranks, or ",
               "lower train.micro_batch");
}

// text on stdout in one write(2) (a block under PIPE_BUF), after what stdout
// holds: mpirun forwards it in one piece, so ranks' blocks never interleave.
void write_at_once(const std::string& text) {
  std::fflush(stdout);
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // stdout gone: nothing to report to
    done += static_cast<size_t>(n);
  }
}

// --memory-json: this rank's report as one JSON line per tag.
void print_memory_json(Trainer& trainer, Pools& pools) {
  mesh::Mesh& m = trainer.mesh();
  const MemoryRankCoords at{.world_rank = m.world_rank(),
                            .pp_rank = trainer.pp_rank(),
                            .dp_rank = m.dp().rank(),
                            .cp_rank = m.cp().rank(),
                            .tp_rank = trainer.tp_rank(),
                            .ep_rank = m.ep().rank()};
  write_at_once(memory_json_lines(at, pools.report()));
}

// One step, its wall time appended to `seconds`; then (log.trace_ops) its
// ops' device spans.
StepStats timed_step(Trainer& trainer, std::vector<double>& seconds, kernels::OpTracer* ops) {
  const auto start = Clock::now();
  StepStats s = trainer.step();
  seconds.push_back(seconds_since(start));
  if (ops) ops->flush();  // the step's device spans, read once the step is done
  return s;
}

// --plan with a cluster: the predicted step beside the measured median of
// the steps after the first (which pays one-time start-up costs).
void print_step_time_check(double predicted, std::vector<double> seconds) {
  if (seconds.size() > 1) seconds.erase(seconds.begin());
  if (seconds.empty()) return;
  std::sort(seconds.begin(), seconds.end());
  const double measured = seconds[seconds.size() / 2];
  std::printf("plan: step time predicted %.4g s, measured %.4g s (the median of %zu step(s) after the first): "
              "measured / predicted = %.2f\n",
              predicted, measured, seconds.size(), measured / predicted);
  std::fflush(stdout);
}

// loom train --plan: the rank's predicted peak per tag beside its measured
// one, after its first step, in one write (ranks' tables do not interleave).
void print_plan_check(Trainer& trainer, Pools& pools, const MemoryReport& planned) {
  const MemoryReport measured = pools.report();
  std::string out = concat("plan: rank ", trainer.mesh().world_rank(), " after its first step\n",
                           "tag          predicted MiB  measured MiB  difference (bytes)\n");
  for (int i = 0; i < kNumMemTags; ++i) {
    const auto tag = static_cast<MemTag>(i);
    char line[160];
    std::snprintf(line, sizeof line, "%-12s %14.2f %13.2f  %lld\n", std::string(mem_tag_name(tag)).c_str(),
                  static_cast<double>(planned[tag].peak) / (1 << 20), static_cast<double>(measured[tag].peak) / (1 << 20),
                  static_cast<long long>(measured[tag].peak) - static_cast<long long>(planned[tag].peak));
    out += line;
  }
  write_at_once(out);
}

// What save_model wrote into dir.
// save_model, and when the disk does not take the model, where the run's
// state is and how the same command finishes it (a previous model is kept).
void write_final_model(Trainer& trainer, const std::string& out_dir, const std::string& newest) {
  try {
    save_model(trainer, out_dir);
  } catch (const Error& e) {
    fail("train: the final model was not written to '", out_dir, "': ", e.what(), ". ",
         newest.empty() ? std::string("There is no checkpoint (checkpoint.every = 0): the run's steps are lost")
                        : concat("The newest checkpoint is ", newest, ": make room and run the same command to ",
                                 "train on from it and write the model"));
  }
}

std::string written_model(const RunConfig& cfg, const std::string& dir) {
  if (!cfg.lora.adapters.enabled()) return concat(dir, "/model.safetensors and ", dir, "/loom_config.json");
  return concat("the LoRA adapter ", dir, "/", model::kPeftWeightsFile, " and ", model::kPeftConfigFile,
                " (PEFT's format; loom lora merge makes a model of it)");
}

// "N parameters", or a LoRA run's "N LoRA parameters (rank r) on a frozen
// base of M parameters".
std::string trained_parameters(const RunConfig& cfg) {
  const int64_t P = model::param_count(cfg.model);
  if (!cfg.lora.adapters.enabled()) return concat(P, " parameters");
  return concat(model::lora_param_count(cfg.model, cfg.lora.adapters), " LoRA parameters (rank ",
                cfg.lora.adapters.rank, ") on a frozen base of ", P, " parameters");
}

}  // namespace


TrainSummary run_training(const RunConfig& cfg, const TrainOptions& run_options, Context& ctx) {
  // Only rank 0 of the mesh reports; every rank trains, evaluates and checkpoints.
  const bool lead = ctx.mesh.world_rank() == 0;
  std::optional<StopSignals> own_stop;
  const StopSignals& stop = run_options.stop != nullptr ? *run_options.stop : own_stop.emplace();
  const RunOutputs outputs = prepare_outputs(cfg, run_options, lead);
  TrainSummary summary;
  summary.peak_flops = cfg.log.peak_tflops > 0 ? cfg.log.peak_tflops * 1e12 : measure_peak_flops(compute_dtype(cfg.train), ctx.pools.device());
  Pools& pools = ctx.pools;
  Trainer trainer(cfg, ctx);
  TrainOptions options = run_options;
  if (!lead) options.progress = false, options.metrics_path.clear(), options.memory_report = false;
  RunConfig quiet = cfg;
  if (!lead) quiet.log.metrics.clear();
  const TrainConfig& t = cfg.train;
  if (options.progress) {
    log_info("train: ", model::family_name(cfg.model.family), " ", trained_parameters(cfg), ", ",
             t.steps, " steps of ", t.micro_batch, " x ", t.grad_accum, " x ", t.seq_len, " tokens, peak ",
             summary.peak_flops / 1e9, " GFLOP/s", cfg.log.peak_tflops > 0 ? " (log.peak_tflops)" : " (measured)",
             "; ", ctx.pools.device().is_cpu() ? kernels::cpu_isa_describe() : device_name(ctx.pools.device()));
  }
  CheckpointRun checkpoints(cfg.checkpoint);
  const std::string resume_dir = checkpoints.resume(trainer);
  if (!resume_dir.empty()) {
    LOOM_REQUIRE(trainer.steps_done() < t.steps, "the checkpoint ", resume_dir, " is at step ", trainer.steps_done(),
                 ", at or past train.steps = ", t.steps, ": there is nothing left to train; raise train.steps to "
                 "train on, or set checkpoint.resume = never to start over");
    if (options.progress) log_info("resumed from ", resume_dir, " at step ", trainer.steps_done());
  }
  const int64_t first_step = trainer.steps_done();
  const std::unique_ptr<TraceRecorder> trace = start_trace(cfg, trainer);
  trainer.set_trace(trace.get());
  std::unique_ptr<kernels::OpTracer> ops = start_op_trace(cfg, trace.get());
  Reporter reporter(quiet, options, trainer.flops_per_token(), summary.peak_flops, first_step);
  const bool eval = t.eval_every > 0;
  if (eval && first_step == 0) {
    summary.initial_val_loss = trainer.evaluate();
    reporter.initial_eval(*summary.initial_val_loss);
  }
  const CheckpointConfig& ckpt = cfg.checkpoint;
  // The final model, written before the last checkpoint: a kill between the
  // two leaves the step before as the newest checkpoint, so the same command
  // retrains the last step and writes both, never a run that is complete in
  // checkpoint.dir but has no model.
  const auto write_model = [&] {
    if (outputs.out_dir.empty()) return;
    write_final_model(trainer, outputs.out_dir, checkpoints.newest());
    if (options.progress) log_info("train: wrote ", written_model(cfg, outputs.out_dir));
  };
  int64_t bad_in_a_row = 0;
  const auto start = Clock::now();
  // A signal during start-up stops the run before its first step.
  summary.stop_signal = agree_on_stop(trainer, stop.received());
  std::vector<double> step_seconds;  // each step's wall time, for --plan's step-time check
  for (int64_t i = first_step; i < t.steps && summary.stop_signal == 0; ++i) {
    StepStats s = timed_step(trainer, step_seconds, ops.get());
    const auto rank = static_cast<size_t>(ctx.mesh.world_rank());
    if (i == first_step && rank < run_options.planned_memory.size())
      print_plan_check(trainer, pools, run_options.planned_memory[rank]);
    bad_in_a_row = s.bad ? bad_in_a_row + 1 : 0;
    // Diverged: the bad steps' updates were skipped, so the weights are the
    // last good step's; nothing is saved over the checkpoints there are.
    LOOM_REQUIRE(bad_in_a_row <= t.max_bad_steps, "train: step ", s.step, " diverged (", describe_bad_step(s),
                 "), ", bad_in_a_row, " bad step", bad_in_a_row == 1 ? "" : "s", " in a row, train.max_bad_steps = ",
                 t.max_bad_steps, ": stopped without saving; the newest checkpoint is ",
                 checkpoints.newest().empty() ? "none" : checkpoints.newest(),
                 ". Lower train.lr, raise train.warmup_steps or set train.grad_clip, then resume");
    check_memory_budget(run_options.memory_budget_bytes, s.step, checkpoints.newest());
    if (s.bad && options.progress)
      log_warn("step ", s.step, ": ", describe_bad_step(s), ": update skipped (bad step ", bad_in_a_row, " of at most ",
               t.max_bad_steps, " in a row)");
    if (eval && (s.step % t.eval_every == 0 || s.step == t.steps)) s.val_loss = trainer.evaluate();
    if (s.val_loss && s.step == t.steps) summary.final_val_loss = s.val_loss;
    reporter.step(s, seconds_since(start), pools.report().peak_total);
    summary.steps.push_back(s);
    const int signal = s.step < t.steps ? agree_on_stop(trainer, stop.received()) : 0;
    if (s.step == t.steps) {
      stop_tracing(trainer, ops, options.progress);
      write_model();
    }
    const bool due = ckpt.every > 0 && !s.bad && (s.step % ckpt.every == 0 || s.step == t.steps || signal != 0);
    if (due) {
      TraceSpan span(trace.get(), "checkpoint");
      const std::string dir = checkpoints.save(trainer);
      if (options.progress) log_info("checkpoint: wrote ", dir);
    }
    summary.stop_signal = signal;
  }
  summary.seconds = seconds_since(start);
  if (trainer.ps()) finish_ps_worker(trainer, trainer.steps_done() - first_step, lead);
  stop_tracing(trainer, ops, options.progress);
  const bool finished = summary.stop_signal == 0;
  if (trace) finish_trace(cfg.log.trace, trainer, *trace);
  if (!finished && lead) {
    log_warn("train: stopped by ", signal_name(summary.stop_signal), " after step ", trainer.steps_done(), " of ",
             t.steps, ckpt.every > 0 ? concat("; run the same command to resume from ",
                                              checkpoints.newest().empty() ? "step 0" : checkpoints.newest())
                                     : std::string("; checkpointing is off (checkpoint.every = 0), so this run's "
                                                   "steps are lost"));
  }
  if (run_options.planned_step_s > 0 && lead) print_step_time_check(run_options.planned_step_s, step_seconds);
  if (run_options.memory_report) print_memory_report(trainer, pools, run_options.memory_budget_bytes);
  if (run_options.memory_json) print_memory_json(trainer, pools);
  return summary;
}

}  // namespace loom::train
