// Errors: loom::Error for anything a user can cause (a message that says what
// is wrong, where, and what is allowed); LOOM_CHECK for internal invariants
// (a failed check is a bug in loom, reported with file:line and the values).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace loom {

// Streams every argument into one string: concat("n=", n, " > ", m).
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// A user-facing error: bad config, flag, file, shape passed to an op.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// An internal invariant broke: a bug in loom, not a user mistake.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

[[noreturn]] void check_failed(const char* file, int line, const char* cond, const std::string& detail);

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(concat(std::forward<Args>(args)...));
}

}  // namespace loom

// LOOM_CHECK(cond, "what", values...): throws InternalError naming file:line,
// the condition and the streamed values when cond is false.
#define LOOM_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) [[unlikely]]                                                        \
      ::loom::check_failed(__FILE__, __LINE__, #cond, ::loom::concat(__VA_ARGS__)); \
  } while (0)

// LOOM_REQUIRE(cond, "message", values...): throws a user-facing loom::Error.
#define LOOM_REQUIRE(cond, ...)                                 \
  do {                                                          \
    if (!(cond)) [[unlikely]]                                   \
      throw ::loom::Error(::loom::concat(__VA_ARGS__));         \
  } while (0)
