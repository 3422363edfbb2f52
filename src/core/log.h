// Logging with a rank prefix: "[rank r/N] message".
//
// The process's rank is its identity, not configuration: main() sets it once
// (set_log_rank) after the communicator exists; it is the one piece of
// process-wide state in core, kept here so every module's log lines carry it.
#pragma once

#include <string>

#include "core/error.h"

namespace loom {

enum class LogLevel { debug, info, warn, error };

void set_log_rank(int rank, int world_size);
void set_log_level(LogLevel level);
// Progress (info and debug lines) to stderr instead of stdout: for a
// command whose stdout is its answer (`loom run`, as ollama run keeps its
// progress off the answer). Warnings and errors always go to stderr.
void set_log_progress_to_stderr(bool on);
// Whether lines start with "[rank r/N] " (on by default; loom run's chat
// turns it off: one process, and the lines share the terminal with a person).
void set_log_rank_prefix(bool on);
int log_rank();
void log_line(LogLevel level, const std::string& message);

template <typename... Args>
void log_info(Args&&... args) { log_line(LogLevel::info, concat(std::forward<Args>(args)...)); }
template <typename... Args>
void log_warn(Args&&... args) { log_line(LogLevel::warn, concat(std::forward<Args>(args)...)); }
template <typename... Args>
void log_error(Args&&... args) { log_line(LogLevel::error, concat(std::forward<Args>(args)...)); }
template <typename... Args>
void log_debug(Args&&... args) { log_line(LogLevel::debug, concat(std::forward<Args>(args)...)); }

}  // namespace loom
