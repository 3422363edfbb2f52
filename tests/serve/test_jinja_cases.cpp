// loom::serve::jinja against the real jinja2 on real-world inputs: the 35
// published chat templates of ../shared/jinja-cases/ on several
// conversations (tools and tool calls where the template uses them), and the
// cases of @huggingface/jinja's test suite that jinja2 itself passes, all
// rendered by tests/ref/ref_jinja_cases.py with Debian's python3-jinja2 in
// transformers' environment. loom must give the same bytes, or a loom::Error
// containing the recorded substring ("" where jinja2 raised something other
// than raise_exception). Variables keep their key order (ordered_json), as
// Python's dicts do. Skipped where the shared folder is missing.
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "serve/jinja/jinja.h"

namespace loom::serve::jinja {
namespace {

using ordered_json = nlohmann::ordered_json;

const ordered_json& ref_file() {
  static const ordered_json file = [] {
    const std::string path = std::string(LOOM_REF_DIR) + "/jinja_cases.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("missing " + path + ": run the ref_jinja_cases fixture");
    return ordered_json::parse(in);
  }();
  return file;
}

Options options_of(const ordered_json& c) {
  const ordered_json& o = c["options"];
  return {.trim_blocks = o["trim_blocks"].get<bool>(),
          .lstrip_blocks = o["lstrip_blocks"].get<bool>(),
          .keep_trailing_newline = o["keep_trailing_newline"].get<bool>(),
          .now_unix = c["now_unix"].get<int64_t>()};
}

// Renders one case and checks it as jinja2 rendered it; true if it matched.
bool check_case(const ordered_json& c) {
  SCOPED_TRACE(c["name"].get<std::string>());
  std::string out, error;
  try {
    out = Template::parse(c["template"].get<std::string>(), options_of(c)).render(c["variables"]);
  } catch (const loom::Error& e) {
    error = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a loom::Error: " << e.what();
    return false;
  }
  if (c.contains("expected")) {
    const std::string expected = c["expected"].get<std::string>();
    EXPECT_EQ(error, "");
    EXPECT_EQ(out, expected);
    return error.empty() && out == expected;
  }
  const std::string wanted = c["error"].get<std::string>();
  const bool ok = !error.empty() && error.find(wanted) != std::string::npos;
  EXPECT_TRUE(ok) << "error: " << error << "\nwanted: " << wanted << "\njinja2: " << c.value("note", "")
                  << "\noutput: " << out;
  return ok;
}

// Checks every case of group; prints "key: passed/total" per key (the
// template's name for published cases); returns the number of cases.
int check_group(const std::string& group) {
  const ordered_json& file = ref_file();
  std::map<std::string, std::pair<int, int>> tally;  // key -> (passed, total)
  int n = 0;
  for (const ordered_json& c : file["cases"]) {
    if (c["group"] != group) continue;
    const std::string name = c["name"].get<std::string>();
    const std::string key = group == "published" ? name.substr(0, name.find('/')) : group;
    auto& [passed, total] = tally[key];
    passed += check_case(c) ? 1 : 0;
    ++total;
    ++n;
  }
  for (const auto& [key, t] : tally) std::printf("%s: %d/%d\n", key.c_str(), t.first, t.second);
  return n;
}

// Why there are no cases (the shared folder was not found), or "".
std::string missing_reason() { return ref_file().value("missing", ""); }

TEST(JinjaCases, PublishedTemplatesRenderAsJinja2Does) {
  if (const std::string why = missing_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_GT(check_group("published"), 100);
}

TEST(JinjaCases, PeerSuiteCasesThatJinja2PassesRenderAlike) {
  if (const std::string why = missing_reason(); !why.empty()) GTEST_SKIP() << why;
  EXPECT_GT(check_group("peer"), 100);
}

}  // namespace
}  // namespace loom::serve::jinja
