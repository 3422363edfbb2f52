// A small blocking HTTP/1.1 client (Boost.Beast) for `loom run` and `loom
// ps`: one request, the body handed over piece by piece as it arrives (a
// token stream), and a way out between pieces (Ctrl-C stops an answer).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

namespace loom::serve {

struct HttpResult {
  int status = 0;
  std::string body;  // what on_data did not take (all of it without on_data)
};

// base_url: "http://host:port". on_data (optional) gets each piece of the
// body and returns false to stop reading (the connection is closed);
// interrupted (optional) is asked between waits (every 100 ms) and stops
// the request the same way. loom::Error when the server cannot be reached
// within connect_timeout or the connection breaks. api_key (not empty):
// sent as "Authorization: Bearer KEY".
HttpResult http_request(const std::string& base_url, const std::string& method, const std::string& target,
                        const std::string& body, const std::function<bool(std::string_view)>& on_data = nullptr,
                        const std::function<bool()>& interrupted = nullptr,
                        std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(2000),
                        const std::string& api_key = {});

// Whether something answers GET base_url/api/version within timeout.
bool server_is_up(const std::string& base_url, std::chrono::milliseconds timeout);

}  // namespace loom::serve
