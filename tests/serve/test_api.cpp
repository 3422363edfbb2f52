// serve::Api before the server is ready (the model still loading): /health
// and the API answer 503 with the envelope, /metrics and GET / answer, an
// unknown route is a 404 -- what a load balancer and ollama's clients see
// while `loom serve` starts.
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

}  // namespace
}  // namespace loom::serve
