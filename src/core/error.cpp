#include "core/error.h"

namespace loom {

void check_failed(const char* file, int line, const char* cond, const std::string& detail) {
  throw InternalError(concat("internal error at ", file, ":", line, ": check `", cond, "` failed",
                             detail.empty() ? "" : ": ", detail));
}

}  // namespace loom
