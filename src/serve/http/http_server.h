// The HTTP/1.1 server under `loom serve`: Boost.Beast on a few Asio threads
// (one by default), every connection asynchronous, so a thousand open token
// streams cost a thousand sockets, not a thousand threads (the measured
// choice: BENCHMARKS.md "HTTP library"). It knows nothing of models: a
// Handler turns each request into a response, whose body is either ready or
// comes later from a BodySource fed by another thread (the engine loop).
//
// Everything a client controls is bounded: header and body bytes (431, 413),
// the wait for a request to arrive (idle and slow senders), each write (a
// client that stops reading is dropped), open connections (503). A client
// that disconnects while its response is being produced is noticed at once
// (the socket is watched for end-of-file) and its source cancelled.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::serve {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // target without the query
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case
  std::string body;
  std::string peer;  // the client's address and port
  std::chrono::steady_clock::time_point received;

  // The first header of that name (any case), or "".
  std::string header(std::string_view name) const;
};

// A response body that another thread produces piece by piece.
class BodySource {
 public:
  virtual ~BodySource() = default;
  // Called once, on the connection's thread, before the first pull();
  // wake() may then be called from any thread, any number of times, to say
  // that pull() has more to give.
  virtual void start(std::function<void()> wake) = 0;
  // Appends what is ready to out; true once the body is complete.
  virtual bool pull(std::string& out) = 0;
  // The client went away (or was dropped) before the end.
  virtual void cancel() = 0;
  // The status: of a body sent whole (not chunked), known at the end; of a
  // stream, asked when its first piece is ready (or it ends without one:
  // then another status than the response's sends the body whole, with
  // content_type()).
  virtual int status() const { return 200; }
  virtual std::string content_type() const { return "application/json"; }
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Set: the body comes from the source; chunked sends each piece as it
  // comes (a stream), else the body is sent whole when complete.
  std::shared_ptr<BodySource> source;
  bool chunked = false;
  // Called once when the exchange is over: the status sent and whether the
  // whole body reached the socket (false: the client went away or was dropped).
  std::function<void(int status, bool complete)> on_end;
  // What the handler adds to the request's access line (asked at the end).
  std::function<std::string()> describe;
};

using Handler = std::function<HttpResponse(const HttpRequest&)>;
// The response for an error the server finds before any handler runs
// (400 malformed HTTP, 413, 431, 503 too many connections) or a handler's
// failure (500); path is the request's where the server read that far, else
// empty.
using ErrorResponder = std::function<HttpResponse(int status, const std::string& message, const std::string& path)>;

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (port() says which)
  int threads = 1;
  int64_t max_body_bytes = 8 << 20;
  int64_t max_header_bytes = 16 << 10;
  std::chrono::milliseconds request_timeout{30'000};  // from connecting (or the last response) to a whole request
  std::chrono::milliseconds write_timeout{30'000};    // for the client to take one write
  int64_t max_connections = 1024;
  // The kernel's send buffer per connection (autotuning would let a client
  // that stops reading park megabytes there before a write blocks and
  // write_timeout can drop it).
  int64_t send_buffer_bytes = 256 << 10;
};

class HttpServer {
 public:
  // Binds and listens (loom::Error when it cannot); serving starts with run().
  HttpServer(HttpOptions options, Handler handler, ErrorResponder errors);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Serves on options.threads threads (this one among them) until stop().
  void run();
  // From any thread: closes the listener and every connection, ends run().
  void stop();
  int64_t open_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::serve
