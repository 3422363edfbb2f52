// The model store from the command line, as ollama's: loom create NAME -f
// Modelfile, loom list, loom show NAME, loom cp SRC DST, loom rm NAME...
// They work on the store directly (--models DIR, default ~/.loom/models); a
// running loom serve sees the change at its next request.
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "model/params.h"
#include "serve/store/model_store.h"
#include "serve/store/modelfile.h"
#include "serve/store/store_models.h"

namespace loom::cli {
namespace {

namespace fs = std::filesystem;

std::string store_root(const std::string& flag) {
  return flag.empty() ? serve::default_store_root(std::getenv("HOME")) : flag;
}

std::string human_bytes(int64_t b) {
  char buf[32];
  if (b >= (1LL << 30)) std::snprintf(buf, sizeof buf, "%.1f GB", b / 1e9);
  else if (b >= (1LL << 20)) std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else std::snprintf(buf, sizeof buf, "%.1f KB", b / 1e3);
  return buf;
}

std::string age(int64_t unix_seconds) {
  const int64_t s = static_cast<int64_t>(std::time(nullptr)) - unix_seconds;
  if (s < 60) return "Less than a minute ago";
  if (s < 3600) return std::to_string(s / 60) + " minutes ago";
  if (s < 86400) return std::to_string(s / 3600) + " hours ago";
  return std::to_string(s / 86400) + " days ago";
}

void run_create(const std::string& name, const std::string& file, const std::string& models) {
  const serve::ModelName n = serve::ModelName::parse(name);
  LOOM_REQUIRE(!fs::is_directory(file), "create: the Modelfile '", file, "' is a directory: give the Modelfile's ",
               "path (-f DIR/Modelfile)");
  std::ifstream in(file);
  LOOM_REQUIRE(in.good(), "create: cannot read the Modelfile '", file, "'");
  std::ostringstream text;
  text << in.rdbuf();
  const serve::Modelfile mf = serve::Modelfile::parse(text.str(), file);
  serve::ModelStore store(store_root(models));
  const std::string base = fs::absolute(fs::path(file)).parent_path().string();
  const serve::StoredModel m = serve::create_model(store, n, mf, base, file);
  std::printf("created %s (%s, %zu layers) in %s\n", m.name.str().c_str(), human_bytes(m.manifest.total_size()).c_str(),
              m.manifest.layers.size(), store.root().c_str());
}

void run_list(const std::string& models) {
  const serve::ModelStore store(store_root(models), false);
  std::printf("%-32s %-14s %-10s %s\n", "NAME", "ID", "SIZE", "MODIFIED");
  for (const serve::StoredModel& m : store.list())
    std::printf("%-32s %-14s %-10s %s\n", m.name.str().c_str(), m.digest.substr(7, 12).c_str(),
                human_bytes(m.manifest.total_size()).c_str(), age(m.modified).c_str());
}

void run_show(const std::string& name, const std::string& part, const std::string& models) {
  const serve::ModelStore store(store_root(models), false);
  const std::optional<serve::StoredModel> m = store.get(serve::ModelName::parse(name));
  LOOM_REQUIRE(m.has_value(), "show: model '", name, "' not found (loom list shows the store's models)");
  const serve::ResolvedModel r = serve::resolve_model(store, *m);
  if (part == "template") return (void)std::printf("%s\n", r.chat.is_plain ? "" : r.chat.source.c_str());
  if (part == "system") return (void)std::printf("%s\n", r.system.c_str());
  if (part == "license") return (void)std::printf("%s\n", r.license.c_str());
  if (part == "parameters") {
    for (const auto& [k, v] : r.parameters.items())
      for (const auto& one : v.is_array() ? v : nlohmann::json::array({v}))
        std::printf("%-16s %s\n", k.c_str(), one.dump().c_str());
    return;
  }
  const model::ModelConfig& c = r.dir.config;
  std::printf("  Model\n    architecture        %s\n    parameters          %lld\n    context length      %lld\n"
              "    embedding length    %lld\n    layers              %lld\n    weights             %s\n",
              c.family == model::Family::llama ? "llama" : "gpt2",
              static_cast<long long>(model::param_count(model::param_specs(c))),
              static_cast<long long>(c.max_seq_len), static_cast<long long>(c.n_embd),
              static_cast<long long>(c.n_layer), human_bytes(m->manifest.find(serve::kMediaWeights)->size).c_str());
  std::printf("\n  Template\n    %s\n", r.chat.is_plain ? "(none: the plain User:/Assistant: template)" : "(its own)");
  if (!r.parameters.empty()) std::printf("\n  Parameters\n    %s\n", r.parameters.dump().c_str());
  if (!r.system.empty()) std::printf("\n  System\n    %s\n", r.system.c_str());
  if (!r.license.empty()) std::printf("\n  License\n    %s\n", r.license.substr(0, r.license.find('\n')).c_str());
}

}  // namespace

void add_model_commands(CLI::App& app) {
  auto models = std::make_shared<std::string>();
  const char* models_help = "the model store (default ~/.loom/models)";

  CLI::App* create = app.add_subcommand("create", "Create a store model from a Modelfile (FROM a model directory, "
                                                  "a Hugging Face directory or a store model)");
  auto name = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>("Modelfile");
  create->add_option("name", *name, "the new model's name[:tag]")->required();
  create->add_option("-f,--file", *file, "the Modelfile")->capture_default_str();
  create->add_option("--models", *models, models_help);
  create->callback([=] { run_create(*name, *file, *models); });

  CLI::App* list = app.add_subcommand("list", "List the store's models");
  list->alias("ls");
  list->add_option("--models", *models, models_help);
  list->callback([=] { run_list(*models); });

  CLI::App* show = app.add_subcommand("show", "Show a store model: architecture, template, parameters, system");
  auto part = std::make_shared<std::string>();
  show->add_option("name", *name, "the model")->required();
  for (const char* p : {"template", "system", "license", "parameters"})
    show->add_flag_callback(std::string("--") + p, [part, p] { *part = p; }, std::string("only its ") + p);
  show->add_option("--models", *models, models_help);
  show->callback([=] { run_show(*name, *part, *models); });

  CLI::App* cp = app.add_subcommand("cp", "Copy a store model under another name (no blob is copied)");
  auto to = std::make_shared<std::string>();
  cp->add_option("source", *name, "the model")->required();
  cp->add_option("destination", *to, "the new name")->required();
  cp->add_option("--models", *models, models_help);
  cp->callback([=] {
    serve::ModelStore store(store_root(*models));
    LOOM_REQUIRE(store.copy(serve::ModelName::parse(*name), serve::ModelName::parse(*to)), "model '", *name,
                 "' not found in ", store.root());
    std::printf("copied '%s' to '%s'\n", name->c_str(), to->c_str());
  });

  CLI::App* rm = app.add_subcommand("rm", "Remove store models (a blob goes when no model uses it)");
  auto names = std::make_shared<std::vector<std::string>>();
  rm->add_option("names", *names, "the models")->required();
  rm->add_option("--models", *models, models_help);
  rm->callback([=] {
    serve::ModelStore store(store_root(*models));
    for (const std::string& n : *names) {
      LOOM_REQUIRE(store.remove(serve::ModelName::parse(n)), "rm: model '", n, "' not found");
      std::printf("deleted '%s'\n", n.c_str());
    }
  });
}

}  // namespace loom::cli
