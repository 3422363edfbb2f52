#include "serve/store/modelfile.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"

namespace loom::serve {
namespace {

using json = nlohmann::json;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::string modelfile_quote(const std::string& text, bool triple) {
  // A line of the text ending in the quotes would close the value there (Reader::value).
  const auto closes_early = [&](std::string_view quotes) {
    for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', nl + 1)) {
      std::string_view before(text.data(), nl);
      while (!before.empty() && std::isspace(static_cast<unsigned char>(before.back()))) before.remove_suffix(1);
      if (before.ends_with(quotes)) return true;
    }
    return false;
  };
  // "text" must not open with """ (a text "" or one starting with "").
  const bool single_ok = !closes_early("\"") && !("\"" + text + "\"").starts_with("\"\"\"");
  if (!triple && single_ok) return "\"" + text + "\"";
  if (!closes_early("\"\"\"")) return "\"\"\"" + text + "\"\"\"";
  return "\"" + text + "\"";  // a line ending in """ (so in " too): no form reads it back whole
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Reads Modelfile text instruction by instruction.
class Reader {
 public:
  Reader(std::string_view text, std::string where) : text_(text), where_(std::move(where)) {}

  [[noreturn]] void fail(int line, const std::string& message) const {
    throw loom::Error(where_ + ":" + std::to_string(line) + ": " + message);
  }

  // The next instruction's keyword and the line it is on; false at the end.
  bool next(std::string& keyword, int& line) {
    while (pos_ < text_.size()) {
      const std::string_view rest = current_line();
      const std::string_view t = trim(rest);
      if (t.empty() || t[0] == '#') {
        skip_line();
        continue;
      }
      size_t k = 0;
      while (k < t.size() && !std::isspace(static_cast<unsigned char>(t[k]))) ++k;
      keyword = lower(std::string(t.substr(0, k)));
      line = line_;
      pos_ += static_cast<size_t>(t.data() - rest.data()) + k;
      return true;
    }
    return false;
  }

  // The instruction's value, read as ollama's parser does: one opening with """ or " runs over as many
  // lines as it takes, up to the first line end where it is closed (its text, trimmed, ends with the same
  // quotes), so """...""""" holds a value ending in a quote; the quotes go, nothing inside is unescaped
  // (C:\\dir stays as written). Else the rest of the line, trimmed.
  std::string value(int line) {
    skip_blanks();
    const std::string_view open = text_.substr(pos_, 3) == "\"\"\"" ? "\"\"\""
                                  : text_.substr(pos_, 1) == "\"" ? "\""
                                                                   : "";
    if (open.empty()) {
      std::string v(trim(current_line()));
      skip_line();
      return v;
    }
    const size_t start = pos_;
    for (size_t end = pos_;; ++line_) {
      end = text_.find('\n', end);
      const std::string_view v = trim(text_.substr(start, end == std::string_view::npos ? end : end - start));
      if (v.size() >= 2 * open.size() && v.substr(v.size() - open.size()) == open) {
        pos_ = end == std::string_view::npos ? text_.size() : end + 1;
        ++line_;
        return std::string(v.substr(open.size(), v.size() - 2 * open.size()));
      }
      if (end == std::string_view::npos) break;
      ++end;
    }
    fail(line, open.size() == 3 ? "a \"\"\" value is not closed" : "a \" value is not closed");
  }

  // A single word (PARAMETER's name, MESSAGE's role).
  std::string word(int line, const char* what) {
    skip_blanks();
    size_t k = pos_;
    while (k < text_.size() && !std::isspace(static_cast<unsigned char>(text_[k]))) ++k;
    if (k == pos_) fail(line, std::string("missing ") + what);
    std::string w(text_.substr(pos_, k - pos_));
    pos_ = k;
    return w;
  }

 private:
  std::string_view current_line() const {
    const size_t nl = text_.find('\n', pos_);
    return text_.substr(pos_, nl == std::string_view::npos ? std::string_view::npos : nl - pos_);
  }
  void skip_line() {
    const size_t nl = text_.find('\n', pos_);
    pos_ = nl == std::string_view::npos ? text_.size() : nl + 1;
    ++line_;
  }
  void skip_blanks() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\r')) ++pos_;
  }
  std::string_view text_;
  std::string where_;
  size_t pos_ = 0;
  int line_ = 1;
};

double parse_number(const std::string& name, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  LOOM_REQUIRE(!value.empty() && end == value.c_str() + value.size() && std::isfinite(v), "PARAMETER ", name,
               " takes a number, got '", value, "'");
  return v;
}

int64_t parse_integer(const std::string& name, const std::string& value) {
  const double v = parse_number(name, value);
  LOOM_REQUIRE(std::trunc(v) == v && std::abs(v) < 9e18, "PARAMETER ", name, " takes an integer, got '", value, "'");
  return static_cast<int64_t>(v);
}

}  // namespace

namespace {

// ollama's options that change nothing in loom's answer on a CPU (where the weights sit, threads, batching,
// memory mapping): accepted, kept for show --modelfile, and ignored, so an ollama Modelfile works unchanged.
constexpr const char* kIgnoredParameters[] = {"num_gpu",  "main_gpu", "num_thread", "num_batch",
                                              "low_vram", "numa",     "use_mmap",   "use_mlock"};

bool ignored_parameter(const std::string& name) {
  return std::any_of(std::begin(kIgnoredParameters), std::end(kIgnoredParameters),
                     [&](const char* n) { return name == n; });
}

// mirostat, which loom has no counterpart for unless 0 (off: loom samples by temperature, top_k, top_p,
// min_p); mirostat_eta and mirostat_tau are read only when mirostat is on (llama.cpp's sampler), so with
// mirostat 0 they change nothing. repeat_last_n: the tokens repeat_penalty looks at (-1 all, 0 none).
bool sampling_parameter(json& params, const std::string& name, const std::string& value) {
  if (name == "mirostat") {
    LOOM_REQUIRE(parse_integer(name, value) == 0, "PARAMETER mirostat ", value, " is not supported: loom has no "
                 "mirostat sampling (only mirostat 0, off); it samples with temperature, top_k, top_p and min_p");
    params[name] = 0;
  } else if (name == "mirostat_eta" || name == "mirostat_tau") {
    params[name] = parse_number(name, value);
  } else if (name == "repeat_last_n") {
    const int64_t n = parse_integer(name, value);
    LOOM_REQUIRE(n >= -1 && n <= INT32_MAX, "PARAMETER repeat_last_n ", value, " is invalid: allowed -1 (every ",
                 "token), 0 (none) or the last N tokens of the prompt and answer");
    params[name] = n;
  } else {
    return false;
  }
  return true;
}

}  // namespace

void set_parameter(json& params, const std::string& name, const std::string& value) {
  const auto range = [&](double v, double lo, double hi, const char* allowed) {
    LOOM_REQUIRE(v >= lo && v <= hi, "PARAMETER ", name, " ", value, " is invalid: allowed ", allowed);
    return v;
  };
  if (name == "stop") {
    LOOM_REQUIRE(!value.empty(), "PARAMETER stop needs a non-empty string");
    params["stop"].push_back(value);
  } else if (name == "temperature") {
    params[name] = range(parse_number(name, value), 0, 2, "0 to 2");
  } else if (name == "top_p" || name == "min_p") {
    params[name] = range(parse_number(name, value), 0, 1, "0 to 1");
  } else if (name == "presence_penalty" || name == "frequency_penalty") {
    params[name] = range(parse_number(name, value), -2, 2, "-2 to 2");
  } else if (name == "repeat_penalty") {
    params[name] = range(parse_number(name, value), 1e-6, 1e6, "> 0");
  } else if (name == "top_k" || name == "num_predict" || name == "num_ctx" || name == "seed") {
    const int64_t v = parse_integer(name, value);
    // num_predict: ollama's -1 is no limit and -2 fills the context; loom generates up to the context's end
    // (or an end token) for both. num_ctx: a prompt token and a new one at least (the engine's minimum).
    if (name == "num_predict") range(double(v), -2, 1e9, "-2 (fill the context), -1 (no limit) or 0 and more");
    else if (name == "num_ctx") range(double(v), 2, 1e9, "2 or more (a prompt token and a new one)");
    else if (name == "top_k") range(double(v), 0, 1e9, ">= 0");
    params[name] = v;
  } else if (ignored_parameter(name)) {
    params[name] = value == "true" || value == "false" ? json(value == "true") : json(parse_number(name, value));
  } else if (!sampling_parameter(params, name, value)) {
    throw loom::Error("unknown PARAMETER '" + name + "': loom knows temperature, top_k, top_p, min_p, seed, "
                      "num_predict, num_ctx, stop, repeat_penalty, presence_penalty, frequency_penalty, "
                      "mirostat (0), mirostat_eta, mirostat_tau, repeat_last_n, and ignores num_gpu, main_gpu, "
                      "num_thread, num_batch, low_vram, numa, use_mmap, use_mlock");
  }
}

Modelfile Modelfile::parse(std::string_view text, const std::string& where) {
  // A UTF-8 byte order mark (Windows editors write one) is not part of the first instruction, as ollama's
  // parser drops it.
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  Modelfile mf;
  Reader r(text, where);
  std::string keyword;
  int line = 0;
  while (r.next(keyword, line)) {
    try {
      if (keyword == "from") {
        if (!mf.from.empty()) r.fail(line, "a second FROM (a Modelfile has one)");
        mf.from = r.value(line);
        mf.from_line = line;
        if (mf.from.empty()) r.fail(line, "FROM needs a model directory or a model name");
      } else if (keyword == "parameter") {
        const std::string name = lower(r.word(line, "the parameter's name"));
        set_parameter(mf.parameters, name, r.value(line));
      } else if (keyword == "template") {
        mf.chat_template = r.value(line);
        mf.has_template = true;
        mf.template_line = line;
      } else if (keyword == "system") {
        mf.system = r.value(line);
        mf.has_system = true;
      } else if (keyword == "license") {
        // Every LICENSE is kept, one after the other (ollama keeps a list; /api/create joins its list so too).
        mf.license += (mf.has_license ? "\n" : "") + r.value(line);
        mf.has_license = true;
      } else if (keyword == "message") {
        const std::string role = lower(r.word(line, "the message's role"));
        if (role != "system" && role != "user" && role != "assistant")
          r.fail(line, "MESSAGE role '" + role + "' is invalid: system, user or assistant");
        mf.messages.emplace_back(role, r.value(line));
      } else if (keyword == "adapter") {
        r.fail(line, "ADAPTER is not supported in a Modelfile: serve a PEFT LoRA adapter beside its base with "
                     "loom serve --model BASE --lora NAME=DIR, or merge it into the weights with loom lora merge "
                     "--base BASE --adapter DIR --out MERGED and write FROM MERGED");
      } else {
        r.fail(line, "unknown instruction '" + keyword +
                         "': a Modelfile has FROM, PARAMETER, TEMPLATE, SYSTEM, MESSAGE and LICENSE");
      }
    } catch (const loom::Error& e) {
      const std::string what = e.what();
      if (what.rfind(where + ":", 0) == 0) throw;
      r.fail(line, what);
    }
  }
  if (mf.from.empty()) throw loom::Error(where + ": no FROM line: say which model to start from");
  return mf;
}

}  // namespace loom::serve
