#include "serve/http/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <optional>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include "core/error.h"

namespace loom::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k.size() == name.size() &&
        std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) { return a == std::tolower(b); }))
      return v;
  return {};
}

namespace {

struct Shared {
  HttpOptions options;
  Handler handler;
  ErrorResponder errors;
  std::atomic<int64_t> connections{0};
};

// One connection: reads a request, answers it (whole, or from a source as it
// produces), then the next request while the client keeps the connection.
// Every handler runs on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<Shared> shared)
      : stream_(std::move(socket)),
        shared_(std::move(shared)),
        // Bytes read ahead of the parser: a header larger than the limit
        // cannot pile up here before the parser says so.
        buffer_(static_cast<size_t>(shared_->options.max_header_bytes) + 65536) {
    ++shared_->connections;
  }
  ~Session() {
    if (response_.source && !source_done_) response_.source->cancel();
    if (response_.on_end) response_.on_end(response_.status, false);
    --shared_->connections;
  }

  asio::any_io_executor executor() { return stream_.get_executor(); }

  void start(bool over_limit) {
    if (over_limit) {
      keep_alive_ = false;
      answer(shared_->errors(503, "the server has too many open connections; retry later", ""));
      return;
    }
    read_request();
  }

 private:
  // The path of the request being read: the parsed target's once its
  // request line is in (a body over the limit fails after the head, with the
  // head consumed), else from the request line as far as it arrived
  // ("METHOD /path?query HTTP/1.1"), or "".
  std::string path_read() const {
    if (parser_) {
      const std::string_view target = parser_->get().target();
      if (!target.empty()) return std::string(target.substr(0, target.find('?')));
    }
    const auto data = buffer_.data();
    const std::string_view head(static_cast<const char*>(data.data()), std::min<size_t>(data.size(), 8192));
    const size_t start = head.find(' ');
    if (start == std::string_view::npos) return "";
    const size_t end = head.find_first_of(" ?\r\n", start + 1);
    if (end == std::string_view::npos) return "";
    return std::string(head.substr(start + 1, end - start - 1));
  }

  void read_request() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(shared_->options.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(shared_->options.max_body_bytes));
    stream_.expires_after(shared_->options.request_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_request(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == beast::error::timeout ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted)
      return close();
    keep_alive_ = false;  // after a malformed request the stream cannot be trusted
    const std::string path = path_read();
    if (ec == http::error::body_limit)
      return answer(shared_->errors(413, "the request body is larger than the server's limit of " +
                                             std::to_string(shared_->options.max_body_bytes) + " bytes", path));
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
      return answer(shared_->errors(431, "the request's headers are larger than the server's limit of " +
                                             std::to_string(shared_->options.max_header_bytes) + " bytes", path));
    if (ec) return answer(shared_->errors(400, "malformed HTTP request: " + ec.message(), path));
    http::request<http::string_body> raw = parser_->release();
    // Beast's header_limit misses many small fields arriving in one read:
    // the headers' size is checked again here.
    int64_t header_bytes = static_cast<int64_t>(raw.target().size());
    for (const auto& field : raw) header_bytes += static_cast<int64_t>(field.name_string().size() + field.value().size()) + 4;
    if (header_bytes > shared_->options.max_header_bytes)
      return answer(shared_->errors(431, "the request's headers are larger than the server's limit of " +
                                             std::to_string(shared_->options.max_header_bytes) + " bytes", path));
    keep_alive_ = raw.keep_alive();
    version_ = raw.version();
    head_request_ = raw.method() == http::verb::head;
    HttpRequest req;
    req.method = std::string(raw.method_string());
    req.target = std::string(raw.target());
    req.path = req.target.substr(0, req.target.find('?'));
    path_ = req.path;
    for (const auto& field : raw) {
      std::string name(field.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      req.headers.emplace_back(std::move(name), std::string(field.value()));
    }
    req.body = std::move(raw.body());
    beast::error_code peer_ec;
    const tcp::endpoint peer = stream_.socket().remote_endpoint(peer_ec);
    if (!peer_ec) req.peer = peer.address().to_string() + ":" + std::to_string(peer.port());
    req.received = std::chrono::steady_clock::now();
    HttpResponse res;
    try {
      res = shared_->handler(req);
    } catch (const std::exception& e) {
      res = shared_->errors(500, std::string("internal error: ") + e.what(), req.path);
    }
    answer(std::move(res));
  }

  void answer(HttpResponse res) {
    response_ = std::move(res);
    source_done_ = false;
    head_sent_ = false;
    if (!response_.source) return write_whole(response_.status, std::move(response_.body));
    watch();
    try {
      // This runs on the engine's thread, which must never hold the last
      // reference to the session: releasing it there can release the model,
      // whose engine loop would then join its own thread. So only the weak
      // reference travels, and the session is locked on its own executor.
      response_.source->start([weak = weak_from_this(), posted = wake_posted_, exec = stream_.get_executor()] {
        if (posted->exchange(true)) return;
        asio::post(exec, [weak, posted] {
          *posted = false;
          if (auto self = weak.lock()) self->pump();
        });
      });
    } catch (const std::exception& e) {
      return source_failed(e);
    }
    pump();
  }

  // A source that threw (out of memory, no thread to start): the server's
  // fault, answered as such before the head, else the connection is dropped.
  void source_failed(const std::exception& e) {
    source_done_ = true;
    if (head_sent_) return drop();
    HttpResponse err = shared_->errors(500, std::string("internal error: ") + e.what(), path_);
    write_whole(500, std::move(err.body), err.content_type);
  }

  template <class Message>
  void set_headers(Message& m, const std::string& content_type) {
    m.set(http::field::server, "loom");
    m.set(http::field::content_type, content_type);
    for (const auto& [k, v] : response_.headers) m.set(k, v);
    m.keep_alive(keep_alive_);
    // How long an idle connection stays open (the request timeout, whole
    // seconds): clients that read the hint (Node's undici, ...) stop reusing
    // a pooled connection before the server closes it, instead of racing
    // the close with their next request.
    if (keep_alive_)
      m.set("Keep-Alive", "timeout=" + std::to_string(std::max<int64_t>(
                                           1, std::chrono::duration_cast<std::chrono::seconds>(
                                                  shared_->options.request_timeout).count())));
  }

  // Takes what the source has ready; writes it (a chunk, or the whole body
  // at the end). One write at a time: a wake during a write pulls after it.
  // A stream's head goes with its first piece, so a source that fails before
  // producing anything (a model that cannot load, a refused request) still
  // answers with its own status and a whole body.
  void pump() {
    if (!response_.source || writing_ || source_done_ || gone_) return;
    std::string out;
    try {
      source_done_ = response_.source->pull(out);
    } catch (const std::exception& e) {
      return source_failed(e);
    }
    const int status = response_.source->status();
    // HTTP/1.0 has no chunked encoding: its streams are sent whole at the end.
    const bool chunked = response_.chunked && version_ >= 11;
    if (!chunked || (!head_sent_ && source_done_ && status != response_.status)) {
      pending_ += out;
      // The stream's own type when it ran as planned (text/event-stream,
      // NDJSON); the source's (JSON) for the error it ended with instead.
      if (source_done_)
        write_whole(status, std::move(pending_),
                    status == response_.status ? response_.content_type : response_.source->content_type());
      return;
    }
    if (out.empty() && !source_done_) return;
    chunk_ = std::move(out);
    writing_ = true;
    stream_.expires_after(shared_->options.write_timeout);
    if (!head_sent_) return write_head();
    write_chunk();
  }

  void write_head() {
    head_sent_ = true;
    head_.emplace(static_cast<http::status>(response_.status), version_);
    set_headers(*head_, response_.content_type);
    head_->chunked(true);
    head_serializer_.emplace(*head_);
    http::async_write_header(stream_, *head_serializer_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->drop();
      self->write_chunk();
    });
  }

  // chunk_, or the end of the body when it is empty (the source is done).
  void write_chunk() {
    auto done = [self = shared_from_this()](beast::error_code ec, size_t) { self->after_chunk(ec); };
    // A piece, then (after it, when the source is done) the end of the body.
    if (chunk_.empty()) asio::async_write(stream_, http::make_chunk_last(), std::move(done));
    else asio::async_write(stream_, http::make_chunk(asio::buffer(chunk_)), std::move(done));
  }

  void after_chunk(beast::error_code ec) {
    writing_ = false;
    if (ec) return drop();
    if (!source_done_) return pump();
    if (chunk_.empty()) return finish();
    chunk_.clear();  // the source's last piece went out: now the end of the body
    writing_ = true;
    stream_.expires_after(shared_->options.write_timeout);
    asio::async_write(stream_, http::make_chunk_last(),
                      [self = shared_from_this()](beast::error_code e, size_t) { self->after_chunk(e); });
  }

  void write_whole(int status, std::string body, const std::string& content_type = "") {
    auto msg = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), version_);
    response_.status = status;
    set_headers(*msg, content_type.empty() ? response_.content_type : content_type);
    if (head_request_) {  // HEAD: the length the body would have, no body
      msg->content_length(body.size());
    } else {
      msg->body() = std::move(body);
      msg->prepare_payload();
    }
    writing_ = true;
    stream_.expires_after(shared_->options.write_timeout);
    http::async_write(stream_, *msg, [self = shared_from_this(), msg](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) return self->drop();
      self->finish();
    });
  }

  // While a source produces, read the socket: end-of-file or an error is the
  // client gone (cancel at once); bytes are a pipelined next request, kept.
  void watch() {
    if (watching_ || buffer_.size() > 65536) return;
    watching_ = true;
    stream_.socket().async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec,
                                                                                       size_t n) {
      self->watching_ = false;
      if (!ec) self->buffer_.commit(n);
      if (self->over_) return self->next_request();
      if (ec) return self->drop();
      self->watch();
    });
  }

  void finish() {
    source_done_ = true;
    over_ = true;
    if (response_.on_end) std::exchange(response_.on_end, nullptr)(response_.status, true);
    response_.source.reset();
    if (watching_) {
      beast::error_code ignored;
      stream_.socket().cancel(ignored);  // the watch's handler goes on to the next request
      return;
    }
    next_request();
  }

  void next_request() {
    over_ = false;
    if (!keep_alive_) return linger();
    read_request();
  }

  // A connection closed after its response: stop sending, then read and
  // discard what the client still sends (the rest of a body too large to
  // take) until it closes, for at most 2 s. Closing at once would reset the
  // connection under a client still writing, which then never reads the
  // response (nginx's "lingering close").
  void linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (linger_deadline_ == std::chrono::steady_clock::time_point{})
      linger_deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    if (std::chrono::steady_clock::now() > linger_deadline_) return close();
    buffer_.clear();
    stream_.expires_at(linger_deadline_);
    stream_.async_read_some(buffer_.prepare(65536), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->linger();
    });
  }

  // The client went away or stopped taking writes: end the source, close.
  void drop() {
    gone_ = true;
    if (response_.source && !source_done_) response_.source->cancel();
    source_done_ = true;
    if (response_.on_end) std::exchange(response_.on_end, nullptr)(response_.status, false);
    close();
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  unsigned version_ = 11;
  std::string path_;  // the current request's
  bool head_request_ = false;
  bool keep_alive_ = true;
  HttpResponse response_;
  std::optional<http::response<http::empty_body>> head_;
  std::optional<http::response_serializer<http::empty_body>> head_serializer_;
  std::string chunk_, pending_;
  bool writing_ = false, source_done_ = false, watching_ = false, over_ = false, gone_ = false, head_sent_ = false;
  // A wake is posted and not yet run (shared with the source's wake callback).
  std::shared_ptr<std::atomic<bool>> wake_posted_ = std::make_shared<std::atomic<bool>>(false);
  std::chrono::steady_clock::time_point linger_deadline_{};
};

}  // namespace

struct HttpServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  int port = 0;

  asio::steady_timer backoff{io};

  void accept() {
    acceptor.async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // Out of file descriptors (or another refusal): wait rather than spin,
        // and let the connections that end free some.
        backoff.expires_after(std::chrono::milliseconds(50));
        backoff.async_wait([this](beast::error_code) { accept(); });
        return;
      }
      const bool over = shared->connections.load() >= shared->options.max_connections;
      beast::error_code ignored;
      socket.set_option(asio::socket_base::send_buffer_size(static_cast<int>(shared->options.send_buffer_bytes)), ignored);
      auto session = std::make_shared<Session>(std::move(socket), shared);
      asio::dispatch(session->executor(), [session, over] { session->start(over); });
      accept();
    });
  }
};

HttpServer::HttpServer(HttpOptions options, Handler handler, ErrorResponder errors) : impl_(std::make_unique<Impl>()) {
  LOOM_REQUIRE(options.threads >= 1, "HTTP threads must be >= 1 (given ", options.threads, ")");
  LOOM_REQUIRE(options.port >= 0 && options.port <= 65535, "--port = ", options.port, " is invalid: allowed 0 to 65535");
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(options.host, ec);
  LOOM_REQUIRE(!ec, "--host '", options.host, "' is not an IP address (e.g. 127.0.0.1, 0.0.0.0, ::1)");
  const tcp::endpoint at(address, static_cast<unsigned short>(options.port));
  Impl& m = *impl_;
  m.acceptor.open(at.protocol(), ec);
  if (!ec) m.acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(at, ec);
  if (!ec) m.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  LOOM_REQUIRE(!ec, "cannot listen on ", options.host, ":", options.port, ": ", ec.message());
  // A connection is a file descriptor: take the hard limit, and keep the
  // connection limit below it (the rest for models, logs and the store).
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NOFILE, &files);
    if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur > 128)
      options.max_connections = std::min<int64_t>(options.max_connections, static_cast<int64_t>(files.rlim_cur) - 64);
  }
  m.port = m.acceptor.local_endpoint().port();
  m.shared->options = std::move(options);
  m.shared->handler = std::move(handler);
  m.shared->errors = std::move(errors);
  m.accept();
}

HttpServer::~HttpServer() = default;

int HttpServer::port() const { return impl_->port; }

void HttpServer::run() {
  std::vector<std::thread> more;
  for (int i = 1; i < impl_->shared->options.threads; ++i) more.emplace_back([this] { impl_->io.run(); });
  impl_->io.run();
  for (std::thread& t : more) t.join();
}

void HttpServer::stop() {
  asio::post(impl_->io, [this] {
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->io.stop();
  });
}

int64_t HttpServer::open_connections() const { return impl_->shared->connections.load(); }

}  // namespace loom::serve
