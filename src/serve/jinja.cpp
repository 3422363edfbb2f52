#include "serve/jinja.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "serve/jinja_ast.h"
#include "serve/jinja_eval.h"

namespace loom::serve::jinja {

Template Template::parse(std::string_view source, const Options& options) {
  return Template(std::make_shared<const Body>(parse_tokens(lex(source, options))), options);
}

namespace {

// How deeply j nests, counted up to kMaxDataDepth + 1, without recursion.
template <typename Json>
size_t depth_of(const Json& root) {
  size_t deepest = 0;
  std::vector<std::pair<const Json*, size_t>> stack = {{&root, 1}};
  while (!stack.empty() && deepest <= kMaxDataDepth) {
    const auto [j, depth] = stack.back();
    stack.pop_back();
    deepest = std::max(deepest, depth);
    if (j->is_array() || j->is_object())
      for (const Json& child : *j) stack.emplace_back(&child, depth + 1);
  }
  return deepest;
}

void check_depth(size_t depth) {
  LOOM_REQUIRE(depth <= kMaxDataDepth, "jinja: the variables nest deeper than ", kMaxDataDepth, " levels");
}

}  // namespace

std::string Template::render(const nlohmann::json& variables) const {
  // (Checked before the copy: converting recurses once a level.)
  check_depth(depth_of(variables));
  return render(nlohmann::ordered_json(variables));
}

std::string Template::render(const nlohmann::ordered_json& variables) const {
  LOOM_REQUIRE(variables.is_object(), "jinja: the variables must be a JSON object, not ", variables.type_name());
  check_depth(depth_of(variables));
  std::string out;
  try {
    Renderer(variables, options_).render(*body_, out);
  } catch (const nlohmann::json::exception& e) {
    throw loom::Error(concat("jinja: ", e.what()));
  }
  return out;
}

}  // namespace loom::serve::jinja
