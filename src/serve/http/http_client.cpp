#include "serve/http/http_client.h"

#include <poll.h>

#include <cerrno>

#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include "core/error.h"

namespace loom::serve {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct Url {
  std::string host, port;
};

Url parse_url(const std::string& base) {
  std::string rest = base;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  LOOM_REQUIRE(rest.find("://") == std::string::npos, "'", base, "': only http:// servers are supported");
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const size_t colon = rest.rfind(':');
  Url u{colon == std::string::npos ? rest : rest.substr(0, colon),
        colon == std::string::npos ? "80" : rest.substr(colon + 1)};
  LOOM_REQUIRE(!u.host.empty() && !u.port.empty(), "'", base, "' is not host:port (e.g. http://127.0.0.1:8000)");
  return u;
}

// Waits up to 100 ms for the socket to be readable; false if interrupted.
bool wait_readable(tcp::socket& s, const std::function<bool()>& interrupted) {
  pollfd p{s.native_handle(), POLLIN, 0};
  while (true) {
    if (interrupted && interrupted()) return false;
    const int n = ::poll(&p, 1, 100);
    if (n > 0 || (n < 0 && errno != EINTR)) return true;
  }
}

}  // namespace

HttpResult http_request(const std::string& base_url, const std::string& method, const std::string& target,
                        const std::string& body, const std::function<bool(std::string_view)>& on_data,
                        const std::function<bool()>& interrupted, std::chrono::milliseconds connect_timeout,
                        const std::string& api_key) {
  const Url url = parse_url(base_url);
  asio::io_context io;
  beast::tcp_stream stream(io);
  beast::error_code ec;
  tcp::resolver resolver(io);
  const auto endpoints = resolver.resolve(url.host, url.port, ec);
  LOOM_REQUIRE(!ec, "cannot resolve ", url.host, ": ", ec.message());
  stream.expires_after(connect_timeout);
  stream.connect(endpoints, ec);
  LOOM_REQUIRE(!ec, "cannot reach the server at ", base_url, ": ", ec.message());
  stream.expires_never();
  http::request<http::string_body> req{http::string_to_verb(method), target, 11};
  req.set(http::field::host, url.host);
  req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req, ec);
  LOOM_REQUIRE(!ec, "cannot send to ", base_url, ": ", ec.message());

  HttpResult result;
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(boost::none);
  char piece[8192];
  while (!parser.is_done()) {
    if (buffer.size() == 0 && !wait_readable(stream.socket(), interrupted)) return result;
    parser.get().body().data = piece;
    parser.get().body().size = sizeof piece;
    http::read_some(stream, buffer, parser, ec);
    if (ec == http::error::need_buffer) ec = {};
    if (ec == asio::error::interrupted) {  // a signal (Ctrl-C) during the read
      if (interrupted && interrupted()) return result;
      ec = {};
    }
    LOOM_REQUIRE(!ec, "the connection to ", base_url, " broke: ", ec.message());
    result.status = static_cast<int>(parser.get().result_int());
    const std::string_view got(piece, sizeof piece - parser.get().body().size);
    if (got.empty()) continue;
    if (!on_data) result.body.append(got);
    else if (!on_data(got)) return result;
  }
  result.status = static_cast<int>(parser.get().result_int());
  return result;
}

bool server_is_up(const std::string& base_url, std::chrono::milliseconds timeout) {
  try {
    return http_request(base_url, "GET", "/api/version", "", nullptr, nullptr, timeout).status == 200;
  } catch (const loom::Error&) {
    return false;
  }
}

}  // namespace loom::serve
