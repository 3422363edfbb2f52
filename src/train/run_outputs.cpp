#include "train/run_outputs.h"

#include <filesystem>
#include <fstream>
#include <string_view>
#include <system_error>

#include "core/error.h"

namespace loom::train {
namespace {

std::string parent_dir(const std::string& file) {
  const std::filesystem::path p = std::filesystem::path(file).parent_path();
  return p.empty() ? "." : p.string();
}

// A file a run would replace must be one a run wrote: a wrong path (the
// config, a model, a checkpoint shard) is refused rather than destroyed.
// `looks_right` judges the file's first bytes; an empty file is anyone's.
void refuse_foreign_output(const std::string& path, const char* what, const char* kind,
                           bool (*looks_right)(std::string_view head)) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec) || std::filesystem::file_size(path, ec) == 0) return;
  std::ifstream in(path, std::ios::binary);
  std::string head(256, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  LOOM_REQUIRE(looks_right(head), what, " '", path, "' exists and is not ", kind, ": a run would replace it; ",
               "give a new path, or remove the file if it is yours to lose");
}

bool looks_like_metrics(std::string_view head) { return head.starts_with("{\"step\":"); }
bool looks_like_trace(std::string_view head) { return head.starts_with("{\"traceEvents\":"); }

}  // namespace

RunOutputs prepare_outputs(const RunConfig& cfg, const TrainOptions& options, bool lead) {
  RunOutputs o;
  o.out_dir = options.out_dir.empty() ? cfg.checkpoint.dir : options.out_dir;
  const std::string& ckpt = cfg.checkpoint.dir;
  const bool saves = !ckpt.empty() && (cfg.checkpoint.every > 0 || ckpt == o.out_dir);
  if (lead && saves) o.locks.push_back(std::make_unique<DirLock>(ckpt, "checkpoint.dir"));
  if (lead && !o.out_dir.empty() && o.out_dir != ckpt) o.locks.push_back(std::make_unique<DirLock>(o.out_dir, "--out"));
  if (saves) probe_writable_dir(ckpt, "checkpoint.dir");
  if (!cfg.log.trace.empty()) probe_writable_dir(parent_dir(cfg.log.trace), "the directory of log.trace");
  if (!lead) return o;
  if (!o.out_dir.empty()) probe_writable_dir(o.out_dir, options.out_dir.empty() ? "checkpoint.dir" : "--out");
  const std::string metrics = options.metrics_path.empty() ? cfg.log.metrics : options.metrics_path;
  if (!metrics.empty()) {
    probe_writable_dir(parent_dir(metrics), "the directory of the metrics file");
    LOOM_REQUIRE(!std::filesystem::is_directory(metrics), "the metrics file '", metrics,
                 "' is a directory: a file path is expected");
    refuse_foreign_output(metrics, "the metrics file", "a loom metrics file (JSON lines of steps)", looks_like_metrics);
  }
  LOOM_REQUIRE(cfg.log.trace.empty() || !std::filesystem::is_directory(cfg.log.trace), "log.trace '",
               cfg.log.trace, "' is a directory: a file path is expected");
  if (!cfg.log.trace.empty()) refuse_foreign_output(cfg.log.trace, "log.trace", "a trace loom wrote", looks_like_trace);
  return o;
}

}  // namespace loom::train
