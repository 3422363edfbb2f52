// The HTTP library choice (BENCHMARKS.md "HTTP library"): Boost.Beast 1.81 on
// one Asio thread streaming C concurrent chunked responses of n chunks, one
// every ms milliseconds, as a token stream does. Usage: beast_stream PORT
#include <boost/asio.hpp>
#include <boost/beast.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

int query_int(const std::string& target, const std::string& key) {
  auto at = target.find(key + "=");
  return at == std::string::npos ? 0 : std::atoi(target.c_str() + at + key.size() + 1);
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  explicit Session(tcp::socket socket) : stream_(std::move(socket)), timer_(stream_.get_executor()) {}
  void start() { read(); }

 private:
  void read() {
    request_ = {};
    http::async_read(stream_, buffer_, request_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec) self->respond();
    });
  }
  void respond() {
    n_ = query_int(std::string(request_.target()), "n");
    ms_ = query_int(std::string(request_.target()), "ms");
    sent_ = 0;
    response_ = {http::status::ok, request_.version()};
    response_.set(http::field::content_type, "text/event-stream");
    response_.chunked(true);
    serializer_.emplace(response_);
    http::async_write_header(stream_, *serializer_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (!ec) self->next();
    });
  }
  void next() {
    if (sent_ == n_) {
      asio::async_write(stream_, http::make_chunk_last(), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (!ec) self->read();
      });
      return;
    }
    timer_.expires_after(std::chrono::milliseconds(sent_ ? ms_ : 0));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      self->event_ = "data: {\"i\": " + std::to_string(self->sent_++) + ", \"text\": \" token\"}\n\n";
      asio::async_write(self->stream_, http::make_chunk(asio::buffer(self->event_)),
                        [self](beast::error_code write_ec, size_t) {
                          if (!write_ec) self->next();
                        });
    });
  }

  beast::tcp_stream stream_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::empty_body> response_;
  std::optional<http::response_serializer<http::empty_body>> serializer_;
  std::string event_;
  int n_ = 0, ms_ = 0, sent_ = 0;
};

void accept(tcp::acceptor& acceptor) {
  acceptor.async_accept([&acceptor](beast::error_code ec, tcp::socket socket) {
    if (!ec) std::make_shared<Session>(std::move(socket))->start();
    accept(acceptor);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PORT\n", argv[0]);
    return 2;
  }
  asio::io_context io(1);
  tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(std::atoi(argv[1]))});
  acceptor.listen(4096);
  accept(acceptor);
  std::fprintf(stderr, "beast_stream: port %s, one thread\n", argv[1]);
  io.run();
}
