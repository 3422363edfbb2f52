// The store routes of ollama's API (OllamaApi in ollama_api.h): show, ps,
// create, delete, copy.
#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "model/params.h"
#include "serve/store/modelfile.h"
#include "serve/ollama/ollama_api.h"
#include "serve/ollama/ollama_format.h"
#include "serve/openai/openai_response.h"
#include "serve/store/store_models.h"
#include "serve/task_source.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;

ApiError not_found(const std::string& name) {
  return ApiError(404, "NotFoundError", "model", "model '" + name + "' not found");
}

// A PARAMETER line's value as a Modelfile writes it.
std::string param_text(const json& v) {
  return v.is_string() ? modelfile_quote(v.get<std::string>(), false) : v.dump();
}

// A Modelfile that recreates m (what ollama show --modelfile prints).
std::string modelfile_of(const StoredModel& m, const ResolvedModel& r) {
  std::string out = "# Modelfile of " + m.name.str() + "\nFROM " + m.name.str() + "\n";
  if (!r.chat.is_plain) out += "TEMPLATE " + modelfile_quote(r.chat.source, true) + "\n";
  if (!r.system.empty()) out += "SYSTEM " + modelfile_quote(r.system, true) + "\n";
  for (const auto& [k, v] : r.parameters.items()) {
    if (v.is_array())
      for (const json& one : v) out += "PARAMETER " + k + " " + param_text(one) + "\n";
    else out += "PARAMETER " + k + " " + param_text(v) + "\n";
  }
  for (const json& msg : r.messages)
    out += "MESSAGE " + msg.value("role", "") + " " + modelfile_quote(msg.value("content", ""), true) + "\n";
  if (!r.license.empty()) out += "LICENSE " + modelfile_quote(r.license, true) + "\n";
  return out;
}

// POST /api/create's newer fields as a Modelfile.
Modelfile modelfile_from_fields(const json& body) {
  Modelfile mf;
  mf.from = required_string(body, "from");
  mf.from_line = 1;
  const auto text = [&](const char* k, bool& has, std::string& into) {
    if (!body.contains(k) || body[k].is_null()) return;
    if (!body[k].is_string()) throw bad_request(k, std::string(k) + " must be a string");
    has = true;
    into = body[k];
  };
  text("template", mf.has_template, mf.chat_template);
  text("system", mf.has_system, mf.system);
  if (body.contains("license") && body["license"].is_array()) {  // ollama sends a list
    mf.has_license = true;
    for (const json& l : body["license"]) {
      if (!l.is_string()) throw bad_request("license", "license must be a string or a list of strings");
      mf.license += (mf.license.empty() ? "" : "\n") + l.get<std::string>();
    }
  } else {
    text("license", mf.has_license, mf.license);
  }
  if (body.contains("parameters") && !body["parameters"].is_null()) {
    if (!body["parameters"].is_object()) throw bad_request("parameters", "parameters must be an object");
    for (const auto& [k, v] : body["parameters"].items())
      for (const json& one : v.is_array() ? v : json::array({v})) {
        try {
          set_parameter(mf.parameters, k, one.is_string() ? one.get<std::string>() : one.dump());
        } catch (const loom::Error& e) {
          throw bad_request("parameters", e.what());
        }
      }
  }
  if (body.contains("messages") && !body["messages"].is_null()) {
    if (!body["messages"].is_array())
      throw bad_request("messages", "messages must be a list of {role, content} objects");
    for (const json& msg : body["messages"]) {
      if (!msg.is_object() || !msg.value("role", json()).is_string() || !msg.value("content", json()).is_string())
        throw bad_request("messages", "messages must be a list of {role, content} objects");
      // Checked here, as a Modelfile's MESSAGE is: a bad role stored would make every chat with the model a 400.
      const std::string role = msg["role"];
      if (role != "system" && role != "user" && role != "assistant")
        throw bad_request("messages", "messages: role '" + role + "' is invalid: system, user or assistant");
      mf.messages.emplace_back(role, msg["content"]);
    }
  }
  return mf;
}

// ollama's files and adapters name blobs a client uploaded (POST /api/blobs), which loom serve does not
// take: refused by name rather than a "success" that made the model without them.
void refuse_unsupported_fields(const json& body) {
  const auto given = [&](const char* k) {
    const auto f = body.find(k);
    return f != body.end() && !f->is_null() && !f->empty();
  };
  if (given("files"))
    throw bad_request("files", "files is not supported by /api/create: loom serve takes no uploaded blobs; make the "
                               "model from a model directory or .gguf file with loom create -f Modelfile, or over "
                               "the API from another store model (from)");
  if (given("adapters"))
    throw bad_request("adapters", "adapters is not supported by /api/create: serve a LoRA adapter (a PEFT directory) "
                                  "with loom serve --lora NAME=DIR, or merge it into the weights with loom lora "
                                  "merge and create the model from the result");
}

}  // namespace

namespace {

// /api/show's body for a model with this configuration and these texts.
json show_json(const model::ModelConfig& c, const json& details, const std::string& modelfile,
               const std::string& parameters, const std::string& template_source, bool renders_tools,
               const json& extra) {
  const std::string arch = c.family == model::Family::llama ? "llama" : "gpt2";
  // What ollama's clients check before they call: text generation, and tools
  // where the template offers them (images are not read).
  json capabilities = json::array({"completion"});
  if (renders_tools) capabilities.push_back("tools");
  json out = {{"modelfile", modelfile},
              {"parameters", parameters},
              {"template", template_source},
              {"capabilities", capabilities},
              {"details", details},
              {"model_info", {{"general.architecture", arch},
                              {"general.parameter_count", model::param_count(model::param_specs(c))},
                              {arch + ".context_length", c.max_seq_len},
                              {arch + ".embedding_length", c.n_embd},
                              {arch + ".block_count", c.n_layer},
                              {arch + ".attention.head_count", c.n_head},
                              {arch + ".attention.head_count_kv", c.n_kv_head},
                              {arch + ".vocab_size", c.vocab_size}}}};
  out.update(extra);
  return out;
}

std::string parameters_text(const json& parameters) {
  std::string out;
  for (const auto& [k, v] : parameters.items())
    for (const json& one : v.is_array() ? v : json::array({v})) out += k + " " + param_text(one) + "\n";
  return out;
}

}  // namespace

HttpResponse OllamaApi::show(const HttpRequest& req) const {
  const json body = parse_body(req.body);
  const std::string text = required_string(body, "model", "name");
  if (store_ == nullptr) {  // --model DIR: the model this server was started with
    for (const std::shared_ptr<LoadedModel>& m : models_.models())
      if (m->name == text) {
        const json details = ollama_details(m->config, m->format, m->quantization_level, m->parent);
        return json_response(200, show_json(m->config, details, "FROM " + m->name + "\n",
                                            parameters_text(m->parameters), m->template_source, m->served.renders_tools,
                                            {{"system", m->system}, {"messages", m->messages}}));
      }
    throw not_found(text);
  }
  const ModelName name = model_name_of(text);
  const std::optional<StoredModel> m = store_->get(name);
  if (!m) throw not_found(text);
  const ResolvedModel r = resolve_model(*store_, *m);
  return json_response(200, show_json(r.dir.config, ollama_details(r.dir.config, r.format, r.quantization_level, ""),
                                      modelfile_of(*m, r), parameters_text(r.parameters),
                                      r.chat.is_plain ? "" : r.chat.source, template_renders_tools(r.chat.source),
                                      {{"system", r.system}, {"license", r.license}, {"messages", r.messages},
                                       {"modified_at", rfc3339(std::chrono::system_clock::from_time_t(m->modified))}}));
}

HttpResponse OllamaApi::ps() const {
  json models = json::array();
  const std::vector<std::shared_ptr<LoadedModel>> loaded = models_.models();
  for (const LoadedStatus& s : models_.loaded()) {
    std::string digest = s.digest.rfind("sha256:", 0) == 0 ? s.digest.substr(7) : s.digest;
    for (const std::shared_ptr<LoadedModel>& m : loaded)
      if (digest.empty() && m->name == s.name) digest = served_digest(*m);
    models.push_back({{"name", s.name},
                      {"model", s.name},
                      {"size", s.bytes},
                      {"size_vram", 0},
                      {"digest", digest},
                      {"details", loaded_details(s.name)},
                      {"expires_at", s.expires ? rfc3339(*s.expires) : "0001-01-01T00:00:00Z"}});
  }
  return json_response(200, {{"models", models}});
}

HttpResponse OllamaApi::create(const HttpRequest& req) {
  const json body = parse_body(req.body);
  const ModelName name = model_name_of(required_string(body, "model", "name"));
  ModelStore& st = store();
  // Quantizing over the API is not done (yet): refused rather than a
  // "success" that did not quantize.
  if (const auto q = body.find("quantize"); q != body.end() && !q->is_null() && *q != json(""))
    throw bad_request("quantize", "quantize is not supported by /api/create: write a quantized GGUF with `loom "
                                  "quantize MODEL OUT.gguf --type " + (q->is_string() ? q->get<std::string>() : "q8_0") +
                                  "` and create the model FROM it with `loom create`");
  refuse_unsupported_fields(body);
  Modelfile mf;
  if (body.contains("modelfile") && !body["modelfile"].is_null()) {
    if (!body["modelfile"].is_string()) throw bad_request("modelfile", "modelfile must be a string");
    mf = Modelfile::parse(body["modelfile"].get<std::string>(), "modelfile");
  } else {
    mf = modelfile_from_fields(body);
  }
  // Over HTTP a model comes from another store model only: a client may not
  // make the server read a directory of its disk (loom create does that).
  if (!st.get(model_name_of(mf.from)))
    throw bad_request("from", "FROM '" + mf.from + "' is not a model in the store: over the API a model is made "
                              "from another store model (use loom create -f Modelfile for a model directory)");
  const bool stream = flag(body, "stream", true);
  // Copying and hashing the weights takes a while: on a thread of its own.
  ++tasks_;  // until the task ends: the server waits for it before it stops
  auto task = [this, &st, name, mf, stream]() -> std::pair<int, std::string> {
    struct Done {
      std::atomic<int>& n;
      ~Done() { --n; }
    } done{tasks_};
    try {
      create_model(st, name, mf, std::nullopt, "modelfile");  // FROM the store only
      std::string out;
      if (stream) out = dump(json{{"status", "reading model"}}) + "\n" + dump(json{{"status", "writing manifest"}}) + "\n";
      return {200, out + dump(json{{"status", "success"}}) + (stream ? "\n" : "")};
    } catch (const ApiError& e) {
      return {e.status(), dump(json{{"error", e.what()}})};
    } catch (const StoreError& e) {  // the store's disk failed: the server's problem (handle's 500)
      return {500, dump(json{{"error", e.what()}})};
    } catch (const std::exception& e) {
      return {400, dump(json{{"error", e.what()}})};
    }
  };
  HttpResponse r;
  r.source = std::make_shared<TaskSource>(std::move(task));
  if (stream) r.content_type = "application/x-ndjson";
  return r;
}

HttpResponse OllamaApi::remove(const HttpRequest& req) {
  const json body = parse_body(req.body);
  const std::string text = required_string(body, "model", "name");
  const ModelName name = store().existing_name(model_name_of(text));  // as loaded: its stored spelling
  if (!store().remove(name)) throw not_found(text);
  models_.unload(name.str());  // if loaded: goes when idle
  HttpResponse r;
  r.body = "";
  return r;
}

HttpResponse OllamaApi::copy(const HttpRequest& req) {
  const json body = parse_body(req.body);
  const std::string from = required_string(body, "source");
  const ModelName source = model_name_of(from), destination = model_name_of(required_string(body, "destination"));
  if (!store().get(source)) throw not_found(from);
  if (!store_->copy(source, destination)) throw not_found(from);  // gone since the check
  HttpResponse r;
  r.body = "";
  return r;
}

// loom reaches no registry: a model already here counts as pulled (clients
// and front-ends pull before they use one), any other is a 404 saying so.
HttpResponse OllamaApi::pull(const HttpRequest& req) const {
  const json body = parse_body(req.body);
  const std::string text = required_string(body, "model", "name");
  const bool stream = flag(body, "stream", true);
  bool here = false;
  if (store_ == nullptr) {
    for (const std::shared_ptr<LoadedModel>& m : models_.models())
      here = here || m->name == text || m->name + ":latest" == text;
  } else {
    here = store_->get(model_name_of(text)).has_value();
  }
  if (!here)
    throw ApiError(404, "NotFoundError", "model",
                   "model '" + text + "' not found: loom serve pulls from no registry (make a model with loom " +
                       "create, or POST /api/create from one here)");
  if (!stream) return json_response(200, {{"status", "success"}});
  HttpResponse r;
  r.content_type = "application/x-ndjson";
  r.body = dump(json{{"status", "pulling manifest"}}) + "\n" + dump(json{{"status", "success"}}) + "\n";
  return r;
}

}  // namespace loom::serve
