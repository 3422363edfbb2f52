#include "text/prepare.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/staged_dir.h"
#include "text/brown.h"
#include "text/shards.h"
#include "text/tokenizer_files.h"

namespace fs = std::filesystem;

namespace loom::text {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_REQUIRE(in, "cannot read input '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::string shard_name(const std::string& split, int64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "_%06lld.bin", static_cast<long long>(index));
  return split + buf;
}

// val_NNNNNN.bin / train_NNNNNN.bin, and the .tmp of one torn by a killed
// write: the names data prepare writes into its output directory.
bool is_prepare_output_name(const std::string& name) {
  std::string base = name;
  if (base.ends_with(".tmp")) base.resize(base.size() - 4);
  for (const std::string split : {"val", "train"}) {
    const size_t digits = base.size() - std::min(base.size(), split.size() + 5);
    if (base.starts_with(split + "_") && base.ends_with(".bin") && digits >= 6 &&
        std::all_of(base.begin() + split.size() + 1, base.end() - 4, [](char c) { return c >= '0' && c <= '9'; })) {
      return true;
    }
  }
  return false;
}

// Collects one split's tokens and writes a shard into `stage` each time
// shard_tokens fill up; the summary names each shard by its path in `out`
// (as the user spelled it), where it lands when the stage is swapped in.
class ShardSink {
 public:
  ShardSink(fs::path stage, fs::path out, std::string split, int64_t shard_tokens, int version,
            SplitSummary& summary)
      : stage_(std::move(stage)), out_(std::move(out)), split_(std::move(split)), shard_tokens_(shard_tokens),
        version_(version), summary_(summary) {}

  void append(const std::vector<int32_t>& tokens) {
    size_t pos = 0;
    while (pos < tokens.size()) {
      const size_t room = static_cast<size_t>(shard_tokens_) - buffer_.size();
      const size_t n = std::min(room, tokens.size() - pos);
      buffer_.insert(buffer_.end(), tokens.begin() + pos, tokens.begin() + pos + n);
      pos += n;
      if (static_cast<int64_t>(buffer_.size()) == shard_tokens_) flush();
    }
    summary_.tokens += static_cast<int64_t>(tokens.size());
    summary_.documents += 1;
  }

  void finish() {
    if (!buffer_.empty()) flush();
  }

 private:
  void flush() {
    const std::string name = shard_name(split_, static_cast<int64_t>(summary_.files.size()));
    write_shard((stage_ / name).string(), buffer_, version_);
    summary_.files.push_back((out_ / name).string());
    buffer_.clear();
  }

  fs::path stage_, out_;
  std::string split_;
  int64_t shard_tokens_;
  int version_;
  SplitSummary& summary_;
  std::vector<int32_t> buffer_;
};

// The output directory as it will be swapped: absolute, and the directory a
// symbolic link names rather than the link. `shown` is the path as given.
struct OutputDir {
  std::string shown;
  fs::path path;
};

// Absolute, symbolic links resolved as far as the path exists, no trailing
// separator ("out/" -> "/cwd/out"); empty if it cannot be resolved.
fs::path resolve_dir(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(dir), ec);
  if (ec) return {};
  if (!p.has_filename() && p != p.root_path()) p = p.parent_path();
  return p;
}

OutputDir resolve_output_dir(const std::string& dir) {
  LOOM_REQUIRE(!dir.empty(), "data prepare: --output is empty");
  const fs::path p = resolve_dir(dir);
  LOOM_REQUIRE(!p.empty(), "output '", dir, "' cannot be resolved to a directory path");
  std::error_code ec;
  LOOM_REQUIRE(p.has_parent_path() && p != p.root_path(), "output '", dir,
               "' is the root directory: give a directory for the shards");
  const fs::file_status st = fs::status(p, ec);
  LOOM_REQUIRE(!fs::exists(st) || fs::is_directory(st), "output '", dir,
               "' is an existing file, not a directory: give a directory for the shards (created if missing)");
  return {dir, p};
}

// An existing output directory is replaced as a whole, so it may hold only
// what data prepare writes there; anything else would be lost.
void check_output_holds_only_shards(const OutputDir& out) {
  std::error_code ec;
  if (!fs::is_directory(out.path, ec)) return;
  for (const auto& entry : fs::directory_iterator(out.path, ec)) {
    const std::string name = entry.path().filename().string();
    LOOM_REQUIRE(is_prepare_output_name(name) && entry.is_regular_file(), "output directory '", out.shown,
                 "' holds '", name, "', which data prepare did not write: the output directory is replaced as a ",
                 "whole by the new shards, so give a directory that holds only shards (or a new one)");
  }
  LOOM_REQUIRE(!ec, "cannot list output directory '", out.shown, "': ", ec.message());
}

// The directory that receives the new shards and then takes the output's
// place as a whole (prepare.h): .NAME.prepare-PID-N next to it, removed again
// unless committed.
std::unique_ptr<StagedDir> stage_output(const OutputDir& out) {
  std::error_code ec;
  fs::create_directories(out.path.parent_path(), ec);
  LOOM_REQUIRE(!ec, "cannot create output directory '", out.shown, "': ", ec.message());
  try {
    return std::make_unique<StagedDir>(out.path.string(), "prepare");
  } catch (const Error& e) {
    fail("cannot create output directory '", out.shown, "': ", e.what());
  }
}

// Swaps the stage in: the output holds the complete old set until then, and
// still does if this fails (StagedDir::commit).
void commit_output(StagedDir& stage, const OutputDir& out) {
  try {
    stage.commit();
  } catch (const Error& e) {
    fail("cannot move the new shards to output directory '", out.shown, "': ", e.what());
  }
}

// True when the file starts with a token shard's magic (text/shards.h).
bool is_token_shard(const std::string& path) {
  int32_t magic = 0;
  std::ifstream in(path, std::ios::binary);
  return in.read(reinterpret_cast<char*>(&magic), sizeof(magic)) && magic == kShardMagic;
}

// Canonical `path` is `dir` or lies inside it.
bool is_within(const fs::path& path, const fs::path& dir) {
  const auto [d, p] = std::mismatch(dir.begin(), dir.end(), path.begin(), path.end());
  return d == dir.end();
}

struct Document {
  std::vector<int32_t> tokens;
  std::string warning;  // why the file does not look like text, or empty
};

// The token before each document (prepare.h).
int32_t document_delimiter(const Tokenizer& tok) {
  return tok.add_bos() && tok.bos_id() >= 0 ? tok.bos_id() : tok.eos_id();
}

// Each document: its delimiter, then the tokens of its text.
Document tokenize_document(const Tokenizer& tok, const std::string& path, CorpusFormat format) {
  Document doc;
  std::string text = read_file(path);
  const std::string why = non_text_reason(text);
  if (!why.empty()) {
    doc.warning = concat("data prepare: input '", path, "' does not look like text (", why,
                         "): it is tokenised as it is");
  }
  if (format == CorpusFormat::brown) text = brown_to_text(text);
  doc.tokens = tok.encode(text);
  doc.tokens.insert(doc.tokens.begin(), document_delimiter(tok));
  return doc;
}

// Documents [begin, end) tokenised by `threads` workers; the first error wins.
std::vector<Document> tokenize_group(const Tokenizer& tok, const std::vector<std::string>& files, int64_t begin,
                                     int64_t end, CorpusFormat format, int threads) {
  std::vector<Document> docs(static_cast<size_t>(end - begin));
  std::atomic<int64_t> next{begin};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  auto work = [&] {
    for (int64_t i = next++; i < end && !failed; i = next++) {
      try {
        docs[i - begin] = tokenize_document(tok, files[i], format);
      } catch (...) {
        if (!failed.exchange(true)) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int64_t>(threads, end - begin); ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  if (error) std::rethrow_exception(error);
  return docs;
}

// Bytes of `s` outside valid UTF-8 sequences (RFC 3629: no overlong forms,
// no surrogates, nothing above U+10FFFF); a bad sequence counts its first
// byte and decoding resumes at the next one.
int64_t invalid_utf8_bytes(std::string_view s) {
  int64_t bad = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned c = p[i];
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // range of the second byte
    if (c < 0x80) {
      len = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      lo = c == 0xE0 ? 0xA0 : 0x80;  // no overlong form
      hi = c == 0xED ? 0x9F : 0xBF;  // no surrogate
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      lo = c == 0xF0 ? 0x90 : 0x80;  // no overlong form
      hi = c == 0xF4 ? 0x8F : 0xBF;  // nothing above U+10FFFF
    }
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      const unsigned b = p[i + k];
      ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    }
    i += ok ? len : 1;
    bad += ok ? 0 : 1;
  }
  return bad;
}

}  // namespace

std::string non_text_reason(std::string_view bytes) {
  if (bytes.empty()) return {};
  const int64_t nul = std::count(bytes.begin(), bytes.end(), '\0');
  const int64_t bad = invalid_utf8_bytes(bytes);
  const int64_t n = static_cast<int64_t>(bytes.size());
  const bool too_many_bad = static_cast<double>(bad) > kMaxNonUtf8Share * static_cast<double>(n);
  if (nul == 0 && !too_many_bad) return {};
  std::string why;
  if (nul > 0) why = concat(nul, " NUL byte", nul == 1 ? "" : "s");
  if (too_many_bad) {
    char share[16];
    std::snprintf(share, sizeof(share), "%.0f%%", 100.0 * static_cast<double>(bad) / static_cast<double>(n));
    why += concat(why.empty() ? "" : ", ", bad, " of its ", n, " bytes (", share, ") not valid UTF-8");
  }
  return why;
}

InputFiles expand_inputs(const std::vector<std::string>& inputs, CorpusFormat format, const std::string& output_dir) {
  LOOM_REQUIRE(!inputs.empty(), "data prepare: no input given");
  const fs::path out = output_dir.empty() ? fs::path() : resolve_dir(output_dir);
  InputFiles result;
  // A file is read unless it is a token shard (an earlier output, or data).
  auto add_file = [&](const std::string& file) {
    if (is_token_shard(file)) {
      result.skipped.push_back(concat("data prepare: skipping input '", file, "': it is a .bin token shard, not text"));
      return false;
    }
    result.files.push_back(file);
    return true;
  };
  for (const std::string& input : inputs) {
    LOOM_REQUIRE(fs::exists(input), "input '", input, "' does not exist");
    if (!out.empty() && is_within(fs::canonical(input), out)) {
      result.skipped.push_back(concat("data prepare: skipping input '", input, "': it is the output directory '",
                                      output_dir, "' or lies inside it (data prepare does not read its own output)"));
      continue;
    }
    if (!fs::is_directory(input)) {
      LOOM_REQUIRE(fs::is_regular_file(input), "input '", input, "' is neither a regular file nor a directory");
      add_file(input);
      continue;
    }
    std::vector<std::string> found;
    int64_t subdirectories = 0;
    for (const auto& entry : fs::directory_iterator(input)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory() && !name.starts_with(".")) {  // not read, but said: its documents would be missing
        ++subdirectories;
        result.skipped.push_back(concat("data prepare: skipping '", entry.path().string(), "': a subdirectory (an ",
                                        "input directory's own files are read, not its subdirectories'; give it ",
                                        "as an input of its own to read it)"));
      }
      if (!entry.is_regular_file()) continue;
      if (format == CorpusFormat::brown ? is_brown_file_name(name) : !name.starts_with(".")) {
        found.push_back(entry.path().string());
      }
    }
    std::sort(found.begin(), found.end());
    int64_t added = 0;
    for (const std::string& file : found) added += add_file(file) ? 1 : 0;
    LOOM_REQUIRE(added > 0, "input directory '", input, "' holds no ",
                 format == CorpusFormat::brown ? "Brown corpus file (ca01 ... cr09)" : "file",
                 found.empty() ? "" : " besides .bin token shards",
                 subdirectories > 0 ? " (its subdirectories are not read: give them as inputs)" : "");
  }
  return result;
}

std::vector<bool> val_documents(int64_t n, double val_fraction) {
  const int64_t n_val = std::llround(val_fraction * static_cast<double>(n));
  std::vector<bool> is_val(static_cast<size_t>(n));
  for (int64_t i = 0; i < n && n_val > 0; ++i) is_val[i] = (i + 1) * n_val / n > i * n_val / n;
  return is_val;
}

PrepareSummary prepare_shards(const PrepareOptions& opt) {
  LOOM_REQUIRE(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0,
               "data prepare: --val-fraction must be in [0, 1), not ", opt.val_fraction);
  LOOM_REQUIRE(opt.shard_tokens >= 1, "data prepare: --shard-tokens must be at least 1, not ", opt.shard_tokens);
  LOOM_REQUIRE(opt.shard_tokens <= INT32_MAX, "data prepare: --shard-tokens ", opt.shard_tokens,
               " exceeds the format's int32 token count");
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(opt.tokenizer);
  const Tokenizer& tok = *tokenizer;
  LOOM_REQUIRE(document_delimiter(tok) >= 0, "tokenizer '", opt.tokenizer,
               "' has no end-of-text token (nor a BOS it adds) to separate documents with");
  const auto warn = [&](const std::string& line) { opt.warn ? opt.warn(line) : log_warn(line); };
  const OutputDir out = resolve_output_dir(opt.output_dir);
  const InputFiles inputs = expand_inputs(opt.inputs, opt.format, opt.output_dir);
  for (const std::string& line : inputs.skipped) warn(line);
  LOOM_REQUIRE(!inputs.files.empty(), "data prepare: no input left to read: each input is the output directory '",
               opt.output_dir, "', lies inside it, or is a .bin token shard (see the warnings above)");
  check_output_holds_only_shards(out);
  const std::vector<std::string>& files = inputs.files;
  const int64_t n = static_cast<int64_t>(files.size());
  const std::vector<bool> is_val = val_documents(n, opt.val_fraction);
  const int64_t n_val = std::count(is_val.begin(), is_val.end(), true);
  LOOM_REQUIRE(opt.val_fraction == 0.0 || n_val >= 1, "data prepare: --val-fraction ", opt.val_fraction, " of ", n,
               " documents gives no val document (each input file is one document): add inputs or use "
               "--val-fraction 0");
  LOOM_REQUIRE(n_val < n, "data prepare: --val-fraction ", opt.val_fraction, " of ", n,
               " documents leaves no train document");

  PrepareSummary summary;
  std::vector<int64_t> bytes(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    bytes[i] = static_cast<int64_t>(fs::file_size(files[i]));
    summary.input_bytes += bytes[i];
  }
  LOOM_REQUIRE(summary.input_bytes > 0, "data prepare: the input is empty (", n, " files, 0 bytes)");

  summary.vocab_size = tok.vocab_size();
  summary.shard_version = shard_version_for_vocab(tok.vocab_size());
  const std::unique_ptr<StagedDir> stage = stage_output(out);
  ShardSink val(stage->path(), out.shown, "val", opt.shard_tokens, summary.shard_version, summary.val);
  ShardSink train(stage->path(), out.shown, "train", opt.shard_tokens, summary.shard_version, summary.train);

  // Documents are tokenised in parallel in groups and appended in input order.
  const int threads = std::max(1, opt.threads);
  const int64_t group = int64_t{threads} * 8;
  int64_t bytes_done = 0;
  for (int64_t begin = 0; begin < n; begin += group) {
    const int64_t end = std::min(n, begin + group);
    const std::vector<Document> docs = tokenize_group(tok, files, begin, end, opt.format, threads);
    for (int64_t i = begin; i < end; ++i) {
      const Document& doc = docs[i - begin];
      if (!doc.warning.empty()) warn(doc.warning);
      (is_val[i] ? val : train).append(doc.tokens);
      bytes_done += bytes[i];
      if (opt.progress) opt.progress(bytes_done, summary.input_bytes);
    }
  }
  LOOM_REQUIRE(summary.val.tokens + summary.train.tokens > n, "data prepare: the input has no text (", n,
               " documents, ", summary.input_bytes, " bytes, no tokens)");
  val.finish();
  train.finish();
  commit_output(*stage, out);
  return summary;
}

}  // namespace loom::text
