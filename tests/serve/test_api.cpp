// serve::Api before the server is ready (the model still loading): /health
// and the API answer 503 with the envelope, /metrics and GET / answer, an
// unknown route is a 404 -- what a load balancer and ollama's clients see
// while `loom serve` starts.
#include <algorithm>
#include <chrono>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "serve/api.h"

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
