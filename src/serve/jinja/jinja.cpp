#include "serve/jinja/jinja.h"

#include <utility>
#include <vector>

#include "serve/jinja/jinja_ast.h"
#include "serve/jinja/jinja_eval.h"

namespace loom::serve::jinja {

Template Template::parse(std::string_view source, const Options& options) {
  return Template(std::make_shared<const Body>(parse_tokens(lex(source, options))), options);
}

namespace {

void check_depth(size_t depth) {
  LOOM_REQUIRE(depth <= kMaxDataDepth, "jinja: the variables nest deeper than ", kMaxDataDepth, " levels");
}

}  // namespace

std::string Template::render(const nlohmann::json& variables) const {
  // (Checked before the copy: converting recurses once a level.)
  check_depth(data_depth(variables));
  return render(nlohmann::ordered_json(variables));
}

std::string Template::render(const nlohmann::ordered_json& variables) const {
  LOOM_REQUIRE(variables.is_object(), "jinja: the variables must be a JSON object, not ", variables.type_name());
  check_depth(data_depth(variables));
  std::string out;
  try {
    Renderer(variables, options_).render(*body_, out);
  } catch (const nlohmann::json::exception& e) {
    throw loom::Error(concat("jinja: ", e.what()));
  }
  return out;
}

}  // namespace loom::serve::jinja
