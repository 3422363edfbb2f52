#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace loom {

namespace {
std::atomic<int> g_rank{0};
std::atomic<int> g_world{1};
std::atomic<LogLevel> g_level{LogLevel::info};
std::atomic<bool> g_progress_to_stderr{false};
std::atomic<bool> g_rank_prefix{true};
std::mutex g_mutex;
}  // namespace

void set_log_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}
void set_log_level(LogLevel level) { g_level = level; }
void set_log_progress_to_stderr(bool on) { g_progress_to_stderr = on; }
void set_log_rank_prefix(bool on) { g_rank_prefix = on; }
int log_rank() { return g_rank; }

void log_line(LogLevel level, const std::string& message) {
  if (level < g_level.load()) return;
  static constexpr const char* tags[] = {"debug: ", "", "warning: ", "error: "};
  std::lock_guard lock(g_mutex);
  // Errors and warnings go to stderr, progress to stdout (unless told
  // otherwise); both carry the rank.
  std::FILE* out = level >= LogLevel::warn || g_progress_to_stderr.load() ? stderr : stdout;
  // One write per line: processes sharing a file (mpiexec's, srun's output)
  // must not interleave a rank's prefix with another's message.
  std::string line;
  if (g_rank_prefix.load()) line = concat("[rank ", g_rank.load(), "/", g_world.load(), "] ");
  line += tags[static_cast<int>(level)];
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), out);
  std::fflush(out);
}

}  // namespace loom
