// serve::Api before the server is ready (the model still loading): /health
// and the API answer 503 with the envelope, /metrics and GET / answer, an
// unknown route is a 404 -- what a load balancer and ollama's clients see
// while `loom serve` starts. Then the model store and Modelfiles behind
// ollama's store routes.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/memory.h"
#include "infer/engine.h"
#include "io/gguf.h"
#include "model/gguf_model.h"
#include "model/params.h"
#include "serve/api.h"
#include "serve/ollama/ollama_api.h"
#include "serve/store/model_store.h"
#include "serve/store/modelfile.h"
#include "serve/store/store_models.h"

namespace loom::serve {
namespace {

HttpRequest request(std::string method, std::string path, std::string body = "") {
  HttpRequest r;
  r.method = std::move(method);
  r.target = path;
  r.path = std::move(path);
  r.body = std::move(body);
  r.received = std::chrono::steady_clock::now();
  return r;
}

TEST(ApiStarting, HealthAndTheApiAre503UntilReady) {
  Api api(ApiOptions{.api_key = "", .access_log = false});
  for (const auto& [method, path] : {std::pair{"GET", "/health"}, {"GET", "/v1/models"}, {"POST", "/v1/completions"},
                                     {"POST", "/v1/chat/completions"}}) {
    const HttpResponse r = api.handle(request(method, path, R"({"model": "m", "prompt": "x"})"));
    EXPECT_EQ(r.status, 503) << path;
    const nlohmann::json body = nlohmann::json::parse(r.body);
    EXPECT_EQ(body["error"]["code"], 503) << path;
    EXPECT_NE(body["error"]["message"].get<std::string>().find("starting"), std::string::npos) << r.body;
  }
  EXPECT_EQ(api.handle(request("GET", "/metrics")).status, 200);
  EXPECT_EQ(api.handle(request("GET", "/")).status, 200);
  EXPECT_EQ(api.handle(request("GET", "/nope")).status, 404);
  EXPECT_EQ(api.handle(request("POST", "/health")).status, 405);
}

TEST(ApiStarting, ApiKeyIsCheckedBeforeAnythingElse) {
  Api api(ApiOptions{.api_key = "k", .access_log = false});
  EXPECT_EQ(api.handle(request("GET", "/v1/models")).status, 401);
  HttpRequest with_key = request("GET", "/v1/models");
  with_key.headers.emplace_back("authorization", "Bearer k");
  EXPECT_EQ(api.handle(with_key).status, 503);  // authorized, still starting
  EXPECT_EQ(api.handle(request("GET", "/health")).status, 503);  // /health needs no key
}

// Each API's envelope, also for errors before a route runs: ollama's
// {"error": "..."} under /api/, OpenAI's elsewhere and where the path is not
// known.
TEST(ApiStarting, ErrorsComeInTheEnvelopeOfTheirApi) {
  Api api(ApiOptions{.api_key = "k", .access_log = false});
  const nlohmann::json tags = nlohmann::json::parse(api.handle(request("GET", "/api/tags")).body);
  EXPECT_TRUE(tags["error"].is_string()) << tags;
  const nlohmann::json models = nlohmann::json::parse(api.handle(request("GET", "/v1/models")).body);
  EXPECT_EQ(models["error"]["code"], 401) << models;
  for (const auto& [path, ollama] : {std::pair{"/api/chat", true}, {"/v1/chat/completions", false}, {"", false}}) {
    const HttpResponse r = api.error_response(413, "too big", path);
    EXPECT_EQ(r.status, 413);
    const nlohmann::json body = nlohmann::json::parse(r.body);
    EXPECT_EQ(ollama ? body["error"] : body["error"]["message"], "too big") << path << " " << body;
  }
}

TEST(ApiStarting, BearerSchemeInAnyCaseAndRequestIdEchoed) {
  Api api(ApiOptions{.api_key = "k", .access_log = false});
  for (const auto& [header, good] : {std::pair{"Bearer k", true}, {"bearer k", true}, {"BEARER k", true},
                                     {"Bearer kk", false}, {"Bearer ", false}, {"Basic k", false},
                                     {"Bearer  k", false}, {"k", false}}) {
    HttpRequest r = request("GET", "/v1/models");
    r.headers.emplace_back("authorization", header);
    r.headers.emplace_back("x-request-id", "abc");
    const HttpResponse res = api.handle(r);
    EXPECT_EQ(res.status, good ? 503 : 401) << header;  // authorized ones meet "still starting"
    EXPECT_NE(std::find(res.headers.begin(), res.headers.end(), std::pair<std::string, std::string>("X-Request-Id", "abc")),
              res.headers.end());
  }
  EXPECT_NE(api.handle(request("GET", "/api/version")).status, 401);  // open, as "/" is
}

TEST(ApiStarting, CorsOnlyForAllowedOrigins) {
  Api api(ApiOptions{.api_key = "", .access_log = false, .allow_origins = {"http://a.example"}});
  const auto acao = [&](const HttpRequest& r) {
    for (const auto& [name, value] : api.handle(r).headers)
      if (name == "Access-Control-Allow-Origin") return value;
    return std::string("(none)");
  };
  HttpRequest pre = request("OPTIONS", "/v1/chat/completions");
  pre.headers.emplace_back("origin", "http://a.example");
  EXPECT_EQ(api.handle(pre).status, 204);
  EXPECT_EQ(acao(pre), "http://a.example");
  HttpRequest other = request("GET", "/");
  other.headers.emplace_back("origin", "http://b.example");
  EXPECT_EQ(acao(other), "(none)");
  Api open(ApiOptions{.api_key = "", .access_log = false, .allow_origins = {"*"}});
  EXPECT_EQ([&] {
    for (const auto& [name, value] : open.handle(other).headers)
      if (name == "Access-Control-Allow-Origin") return value;
    return std::string("(none)");
  }(), "*");
}

}  // namespace
}  // namespace loom::serve

// The model store and Modelfiles behind ollama's store routes (/api/create, /api/copy, /api/show).
namespace loom::serve {
namespace {

namespace fs = std::filesystem;

// A fresh store under the temporary directory, removed at the end.
struct TempStore {
  fs::path dir = fs::temp_directory_path() / ("loom_store_test_" + std::to_string(::getpid()) + "_" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  TempStore() { fs::remove_all(dir); }
  ~TempStore() { fs::remove_all(dir); }
  size_t blobs() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir / "blobs"), fs::directory_iterator()));
  }
};

std::vector<LayerSource> layers(const std::string& weights, const std::string& system) {
  return {{kMediaWeights, "", weights, ""}, {kMediaSystem, "", system, ""}};
}

TEST(ModelStore, RecreatingAModelRemovesItsOldBlobsButKeepsSharedOnes) {
  TempStore t;
  ModelStore store(t.dir.string());
  store.put_model(ModelName::parse("m"), layers("weights one", "shared"));
  store.put_model(ModelName::parse("other"), layers("weights other", "shared"));
  EXPECT_EQ(t.blobs(), 3u);
  store.put_model(ModelName::parse("m"), layers("weights two", "shared"));  // "weights one" is named by nothing now
  EXPECT_EQ(t.blobs(), 3u);
  EXPECT_EQ(store.read_blob(store.get(ModelName::parse("m"))->manifest.layers[0].digest), "weights two");
}

// A Hugging Face directory's generation_config.json end ids travel with the
// store model made FROM it; a sharded checkpoint is refused by name (one
// weights layer would hold only its index).
TEST(ModelStore, HfDirectoryEosIdsTravelAndShardedCheckpointsAreRefused) {
  TempStore t;
  ModelStore store(t.dir.string());
  const fs::path hf = t.dir.parent_path() / (t.dir.filename().string() + "_hf");
  fs::remove_all(hf);
  fs::create_directories(hf);
  nlohmann::json cfg = {{"model_type", "gpt2"}, {"n_layer", 1}, {"n_embd", 8},    {"n_head", 2},
                        {"n_positions", 16},    {"vocab_size", 32}, {"eos_token_id", 3}};
  std::ofstream(hf / "config.json") << cfg.dump();
  std::ofstream(hf / "generation_config.json") << R"({"eos_token_id": [3, 9]})";
  std::ofstream(hf / "model.safetensors") << "placeholder: create copies the file, serving reads it";
  Modelfile mf;
  mf.from = hf.string();
  StoredModel m = create_model(store, ModelName::parse("m"), mf, std::string("."), "Modelfile");
  EXPECT_EQ(resolve_model(store, m).dir.eos_token_ids, (std::vector<int32_t>{3, 9}));
  fs::remove(hf / "model.safetensors");
  std::ofstream(hf / "model.safetensors.index.json") << R"({"weight_map": {}})";
  try {
    create_model(store, ModelName::parse("sharded"), mf, std::string("."), "Modelfile");
    ADD_FAILURE() << "a sharded checkpoint was stored";
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a sharded checkpoint"), std::string::npos) << e.what();
  }
  fs::remove_all(hf);
}

TEST(ModelStore, CopyOntoAnExistingNameRemovesTheReplacedModelsBlobs) {
  TempStore t;
  ModelStore store(t.dir.string());
  store.put_model(ModelName::parse("a"), layers("weights a", "sys"));
  store.put_model(ModelName::parse("b"), layers("weights b", "sys"));
  ASSERT_TRUE(store.copy(ModelName::parse("a"), ModelName::parse("b")));
  EXPECT_EQ(t.blobs(), 2u);  // "weights b" went with the model b replaced
  ASSERT_TRUE(store.remove(ModelName::parse("a")));
  EXPECT_EQ(t.blobs(), 2u);  // b names them still
}

// Names match in any case, as ollama's getExistingName: My/Model finds, replaces, copies onto and removes
// the stored my/model:v1, keeping its spelling; a name no model has is stored as given.
TEST(ModelStore, NamesMatchInAnyCaseAndKeepTheStoredSpelling) {
  TempStore t;
  ModelStore store(t.dir.string());
  store.put_model(ModelName::parse("my/Model:v1"), layers("weights one", "sys"));
  const std::optional<StoredModel> m = store.get(ModelName::parse("MY/model:V1"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->name.str(), "my/Model:v1");
  EXPECT_EQ(store.existing_name(ModelName::parse("my/model:V1")).str(), "my/Model:v1");
  EXPECT_EQ(store.existing_name(ModelName::parse("New")).str(), "New:latest");
  store.put_model(ModelName::parse("MY/MODEL:v1"), layers("weights two", "sys"));  // replaces, not a second model
  ASSERT_EQ(store.list().size(), 1u);
  EXPECT_EQ(store.list()[0].name.str(), "my/Model:v1");
  EXPECT_EQ(store.read_blob(store.list()[0].manifest.layers[0].digest), "weights two");
  store.put_model(ModelName::parse("other"), layers("weights other", "sys"));
  ASSERT_TRUE(store.copy(ModelName::parse("OTHER"), ModelName::parse("my/model:v1")));
  ASSERT_EQ(store.list().size(), 2u);
  EXPECT_EQ(store.read_blob(store.get(ModelName::parse("my/Model:v1"))->manifest.layers[0].digest), "weights other");
  EXPECT_TRUE(store.remove(ModelName::parse("My/Model:V1")));
  EXPECT_FALSE(store.get(ModelName::parse("my/Model:v1")).has_value());
}

TEST(Modelfile, QuotedValuesReadAsOllamasParserReadsThem) {
  const Modelfile mf = Modelfile::parse("\xEF\xBB\xBF" "FROM ./m\n"
                                        "SYSTEM \"\"\"Always answer \"yes\"\"\"\"\n"
                                        "TEMPLATE \"line one\nline two\"\n"
                                        "MESSAGE user \"C:\\dir\\file\"\n"
                                        "LICENSE MIT for the code\nLICENSE \"\"\"CC-BY-4.0\"\"\"\n",
                                        "M");
  EXPECT_EQ(mf.from, "./m");  // the byte order mark is not part of FROM
  EXPECT_EQ(mf.system, "Always answer \"yes\"");
  EXPECT_EQ(mf.chat_template, "line one\nline two");
  EXPECT_EQ(mf.messages.at(0).second, "C:\\dir\\file");  // backslashes kept
  EXPECT_EQ(mf.license, "MIT for the code\nCC-BY-4.0");
  EXPECT_THROW(Modelfile::parse("FROM m\nSYSTEM \"open\n", "M"), loom::Error);
}

// loom list takes no lock: a namespaced model copied and removed meanwhile (its folders come and go) is
// listed or not, never an error.
TEST(ModelStore, ListingWhileNamespacedModelsComeAndGoNeverFails) {
  TempStore t;
  ModelStore store(t.dir.string());
  store.put_model(ModelName::parse("m"), layers("w", "s"));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      const ModelName n = ModelName::parse("n" + std::to_string(i % 3) + "/a/b/c:v" + std::to_string(i));
      store.copy(ModelName::parse("m"), n);
      store.remove(n);
    }
  });
  for (int i = 0; i < 300; ++i) EXPECT_NO_THROW(store.list());
  stop = true;
  writer.join();
}

// (A text with a line ending in """ reads back in neither form: that line would close the value.)
TEST(Modelfile, QuotedValuesWrittenByShowReadBackWhole) {
  for (const std::string text : {"plain", "ends in a quote\"", "two\nlines", "\"\"\" opens a line\nthen more",
                                 "a line ending \"\nthen \"\"\"", "{{ \"x\" }}\n\"\n", "\"", "\"\"", ""}) {
    for (const bool triple : {true, false}) {
      SCOPED_TRACE(modelfile_quote(text, triple));
      const Modelfile mf = Modelfile::parse("FROM m\nSYSTEM " + modelfile_quote(text, triple) + "\nLICENSE x\n", "M");
      EXPECT_EQ(mf.system, text) << modelfile_quote(text, triple);
      EXPECT_EQ(mf.license, "x");
    }
  }
}

// A PARAMETER num_ctx below 2 would make every request a 500 (the engine cannot load it): refused at create,
// saying the range. ollama's documented options: those that change nothing on a CPU are kept and ignored,
// mirostat only at 0 (off, what loom does), repeat_last_n a window, num_predict -2 fills the context.
TEST(Modelfile, OllamasParametersAreTakenIgnoredOrRefusedByName) {
  nlohmann::json p = nlohmann::json::object();
  const auto refused = [&](const std::string& name, const std::string& value) {
    try {
      set_parameter(p, name, value);
    } catch (const loom::Error& e) {
      return std::string(e.what());
    }
    return std::string("(taken)");
  };
  EXPECT_NE(refused("num_ctx", "1").find("allowed 2 or more"), std::string::npos) << refused("num_ctx", "1");
  EXPECT_NE(refused("mirostat", "2").find("loom has no mirostat"), std::string::npos);
  EXPECT_NE(refused("repeat_last_n", "-2").find("allowed -1 (every token), 0 (none)"), std::string::npos);
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"num_ctx", "2"}, {"num_predict", "-2"}, {"num_gpu", "1"}, {"num_thread", "8"}, {"use_mmap", "false"},
           {"mirostat", "0"}, {"mirostat_tau", "5.0"}, {"repeat_last_n", "-1"}, {"repeat_last_n", "64"}})
    EXPECT_EQ(refused(name, value), "(taken)") << name;
  EXPECT_EQ(p["num_predict"], -2);
  EXPECT_EQ(p["use_mmap"], false);
  EXPECT_EQ(p["repeat_last_n"], 64);
  EXPECT_NE(refused("tfs_z", "1").find("unknown PARAMETER 'tfs_z'"), std::string::npos);
  try {
    Modelfile::parse("FROM m\nADAPTER ./lora\n", "M");
    ADD_FAILURE() << "ADAPTER was taken";
  } catch (const loom::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("M:2: ADAPTER is not supported in a Modelfile"), std::string::npos) << what;
    EXPECT_NE(what.find("--lora NAME=DIR"), std::string::npos) << what;
    EXPECT_NE(what.find("loom lora merge"), std::string::npos) << what;
  }
}

// 40 parts of 120 characters: the manifest's path is longer than the file system takes. The name is
// said to be too long, with the limit, not to clash with another model's.
TEST(ModelStore, ANameTooLongForTheFileSystemIsSaidToBeSo) {
  TempStore t;
  ModelStore store(t.dir.string());
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += std::string(120, 'd') + "/";
  const ModelName name = ModelName::parse(deep + "x");
  EXPECT_FALSE(store.get(name).has_value());
  try {
    store.put_model(name, layers("w", "s"));
    ADD_FAILURE() << "a 4800-character name was stored";
  } catch (const loom::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("is too long for the file system"), std::string::npos) << what;
    EXPECT_NE(what.find("ENAMETOOLONG"), std::string::npos) << what;
    EXPECT_EQ(what.find("clashes"), std::string::npos) << what;
  }
}

// An empty server: its store routes only (no model is loaded).
struct StoreServer {
  Api api{ApiOptions{.api_key = "", .access_log = false}};
  ModelManager models{[](const std::string&) -> std::shared_ptr<LoadedModel> { throw loom::Error("no loads"); },
                      [](const std::string& n) { return ModelName::parse(n).str(); }, ManagerOptions{}};
  OllamaApi ollama;
  explicit StoreServer(ModelStore* store) : ollama(api, models, store) {}
  nlohmann::json call(const std::string& method, const std::string& path, const std::string& body, int& status) {
    const HttpResponse r = ollama.handle(request(method, path, body));
    status = r.status;
    return r.body.empty() ? nlohmann::json() : nlohmann::json::parse(r.body);
  }
};

// A store the server cannot write (here its lock is a folder; a read-only mount answers the same) is the
// server's failure: the error gives the reason, and over the API it is a 500, not a 400 blaming the request.
TEST(ModelStore, AStoreThatCannotBeWrittenIsAServerErrorWithTheReason) {
  TempStore t;
  ModelStore store(t.dir.string());
  store.put_model(ModelName::parse("m"), layers("w", "s"));
  fs::remove(t.dir / ".lock");
  fs::create_directory(t.dir / ".lock");
  try {
    store.copy(ModelName::parse("m"), ModelName::parse("n"));
    ADD_FAILURE() << "copied without the lock";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(": Is a directory"), std::string::npos) << e.what();
  }
  StoreServer server(&store);
  int status = 0;
  const nlohmann::json j = server.call("POST", "/api/copy", R"({"source": "m", "destination": "n"})", status);
  EXPECT_EQ(status, 500) << j.dump();
  EXPECT_NE(j.value("error", "").find("cannot open the model store's lock"), std::string::npos) << j.dump();
}

// A q8_0 GGUF file named ~/TINY.GGUF (the home directory, an uppercase extension, as ollama takes them) makes
// a model that /api/tags and /api/show describe as ollama does: format gguf, quantization_level Q8_0, and
// every field of ModelDetails.
TEST(ModelStore, AnUppercaseGgufUnderHomeIsListedAsGgufQ8_0) {
  TempStore t;
  ModelStore store((t.dir / "s").string());
  model::ModelConfig cfg = model::model_preset("gpt2-tiny");
  cfg.vocab_size = 64, cfg.max_seq_len = 32;
  Pools pools;
  OwnedTensor flat = pools[MemTag::params].empty(DType::f32, {model::param_count(model::param_specs(cfg))});
  model::init_params(flat, model::param_specs(cfg), 5);
  io::GgufWriter w;
  model::gguf_add_model(w, cfg, flat, model::GgufWeights::q8_0, "tiny");
  w.write((t.dir / "TINY.GGUF").string());
  const std::string home = std::getenv("HOME") != nullptr ? std::getenv("HOME") : "";
  ::setenv("HOME", t.dir.c_str(), 1);
  Modelfile mf = Modelfile::parse("FROM ~/TINY.GGUF\n", "M");
  const StoredModel m = create_model(store, ModelName::parse("q8"), mf, std::string("/nowhere"), "M");
  ::setenv("HOME", home.c_str(), 1);
  const ResolvedModel r = resolve_model(store, m);
  EXPECT_EQ(r.format, "gguf");
  EXPECT_EQ(r.quantization_level, "Q8_0");
  StoreServer server(&store);
  int status = 0;
  const nlohmann::json tags = server.call("GET", "/api/tags", "", status);
  const nlohmann::json show = server.call("POST", "/api/show", R"({"model": "q8"})", status);
  for (const nlohmann::json& details : {tags["models"][0]["details"], show["details"]}) {
    EXPECT_EQ(details.value("format", ""), "gguf") << details.dump();
    EXPECT_EQ(details.value("quantization_level", ""), "Q8_0") << details.dump();
    for (const char* key : {"parent_model", "family", "families", "parameter_size"})
      EXPECT_TRUE(details.contains(key)) << key << " missing: " << details.dump();
  }
}

// loom serve --model DIR: its model in /api/tags and /api/ps has a digest (ollama's CLI shows its first 12
// characters), the same for the same model, and every field of ModelDetails.
// A small random GPT-2 on an engine loop: what `loom serve --model DIR` pins.
struct TinyEngine {
  model::ModelConfig cfg = [] {
    model::ModelConfig c = model::model_preset("gpt2-tiny");
    c.vocab_size = 64, c.max_seq_len = 32;
    return c;
  }();
  Pools pools;
  OwnedTensor params = pools[MemTag::params].empty(DType::f32, {model::param_count(model::param_specs(cfg))});
  infer::Engine engine{cfg, params, pools, {.block_size = 8, .max_num_batched_tokens = 32, .max_num_seqs = 2}};
};

TEST(ModelStore, ADirectoryModelHasADigestAndDetails) {
  StoreServer server(nullptr);
  auto owned = std::make_shared<TinyEngine>();
  auto m = std::make_shared<LoadedModel>();
  m->name = "tiny", m->config = owned->cfg, m->bytes = 1000;
  m->loop = std::make_shared<EngineLoop>(owned->engine, nullptr, LoopOptions{});
  m->owner = owned;
  server.models.pin(m);
  int status = 0;
  const nlohmann::json tags = server.call("GET", "/api/tags", "", status);
  const nlohmann::json ps = server.call("GET", "/api/ps", "", status);
  ASSERT_EQ(tags["models"].size(), 1u) << tags.dump();
  ASSERT_EQ(ps["models"].size(), 1u) << ps.dump();
  EXPECT_EQ(tags["models"][0].value("digest", "").size(), 64u) << tags.dump();
  EXPECT_EQ(ps["models"][0].value("digest", ""), tags["models"][0].value("digest", "")) << ps.dump();
  for (const nlohmann::json& details : {tags["models"][0]["details"], ps["models"][0]["details"]}) {
    EXPECT_EQ(details.value("family", ""), "gpt2") << details.dump();
    for (const char* key : {"parent_model", "format", "families", "parameter_size", "quantization_level"})
      EXPECT_TRUE(details.contains(key)) << key << " missing: " << details.dump();
  }
}

}  // namespace
}  // namespace loom::serve
