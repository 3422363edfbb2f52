// A chat template as its model publishes it, from ../shared/jinja-cases
// beside the repository (read from tests, never copied in): its source, or
// "" when the folder is not there (the test then skips).
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace loom::test {

inline std::string published_template(const std::string& name) {
  const auto root = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().parent_path();
  std::ifstream in(root / "shared" / "jinja-cases" / "templates" / (name + ".jinja"));
  std::ostringstream source;
  source << in.rdbuf();
  return source.str();
}

}  // namespace loom::test
