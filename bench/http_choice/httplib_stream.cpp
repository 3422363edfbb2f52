// The HTTP library choice (BENCHMARKS.md "HTTP library"): cpp-httplib 0.11.4
// streaming C concurrent responses of n chunks, one every ms milliseconds,
// as a token stream does. Usage: httplib_stream PORT POOL_THREADS
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PORT POOL_THREADS\n", argv[0]);
    return 2;
  }
  int port = std::atoi(argv[1]);
  size_t pool = std::strtoul(argv[2], nullptr, 10);
  httplib::Server server;
  server.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  server.Get("/stream", [](const httplib::Request& req, httplib::Response& res) {
    int n = std::atoi(req.get_param_value("n").c_str());
    int ms = std::atoi(req.get_param_value("ms").c_str());
    res.set_chunked_content_provider("text/event-stream", [n, ms](size_t, httplib::DataSink& sink) {
      for (int i = 0; i < n; ++i) {
        if (i) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        std::string event = "data: {\"i\": " + std::to_string(i) + ", \"text\": \" token\"}\n\n";
        if (!sink.write(event.data(), event.size())) return false;
      }
      sink.done();
      return true;
    });
  });
  std::fprintf(stderr, "httplib_stream: port %d, %zu pool threads\n", port, pool);
  return server.listen("127.0.0.1", port) ? 0 : 1;
}
