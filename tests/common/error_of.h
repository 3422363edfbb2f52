// The message of the loom::Error f throws, or "" when it throws none: what
// the tests of a clear error compare (many test files still carry a copy of
// their own; new ones include this).
#pragma once

#include <string>

#include "core/error.h"

namespace loom::test {

template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace loom::test
