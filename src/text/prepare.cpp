#include "text/prepare.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "text/bpe.h"
#include "text/brown.h"
#include "text/shards.h"

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

// Collects one split's tokens and writes a shard each time shard_tokens fill up.
class ShardSink {
 public:
  ShardSink(fs::path dir, std::string split, int64_t shard_tokens, int version, SplitSummary& summary)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens), version_(version),
        summary_(summary) {}

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
    remove_stale();
  }

 private:
  void flush() {
    const fs::path path = dir_ / shard_name(split_, static_cast<int64_t>(summary_.files.size()));
    write_shard(path.string(), buffer_, version_);
    summary_.files.push_back(path.string());
    buffer_.clear();
  }

  // Shards of this split left by an earlier, longer run would be read as
  // data by a glob: remove <split>_NNNNNN.bin files this run did not write.
  void remove_stale() {
    const std::set<std::string> written(summary_.files.begin(), summary_.files.end());
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      const bool ours = name.size() == split_.size() + 11 && name.starts_with(split_ + "_") &&
                        name.ends_with(".bin") &&
                        std::all_of(name.begin() + split_.size() + 1, name.end() - 4, ::isdigit);
      if (ours && !written.contains(entry.path().string())) fs::remove(entry.path());
    }
  }

  fs::path dir_;
  std::string split_;
  int64_t shard_tokens_;
  int version_;
  SplitSummary& summary_;
  std::vector<int32_t> buffer_;
};

fs::path make_output_dir(const std::string& dir) {
  LOOM_REQUIRE(!dir.empty(), "data prepare: --output is empty");
  std::error_code ec;
  fs::create_directories(dir, ec);
  LOOM_REQUIRE(!ec, "cannot create output directory '", dir, "': ", ec.message());
  LOOM_REQUIRE(fs::is_directory(dir), "output '", dir, "' is not a directory");
  LOOM_REQUIRE(::access(dir.c_str(), W_OK) == 0, "output directory '", dir, "' is not writable");
  return fs::path(dir);
}

// Each document: EOT, then the tokens of its text.
std::vector<int32_t> tokenize_document(const Gpt2Tokenizer& tok, const std::string& path, CorpusFormat format) {
  std::string text = read_file(path);
  if (format == CorpusFormat::brown) text = brown_to_text(text);
  std::vector<int32_t> ids = tok.encode(text);
  ids.insert(ids.begin(), tok.eot_id());
  return ids;
}

// Documents [begin, end) tokenised by `threads` workers; the first error wins.
std::vector<std::vector<int32_t>> tokenize_group(const Gpt2Tokenizer& tok, const std::vector<std::string>& files,
                                                 int64_t begin, int64_t end, CorpusFormat format, int threads) {
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(end - begin));
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

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, CorpusFormat format) {
  LOOM_REQUIRE(!inputs.empty(), "data prepare: no input given");
  std::vector<std::string> files;
  for (const std::string& input : inputs) {
    LOOM_REQUIRE(fs::exists(input), "input '", input, "' does not exist");
    if (!fs::is_directory(input)) {
      LOOM_REQUIRE(fs::is_regular_file(input), "input '", input, "' is neither a regular file nor a directory");
      files.push_back(input);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(input)) {
      if (!entry.is_regular_file()) continue;
      const std::string name = entry.path().filename().string();
      if (format == CorpusFormat::brown ? is_brown_file_name(name) : !name.starts_with(".")) {
        found.push_back(entry.path().string());
      }
    }
    LOOM_REQUIRE(!found.empty(), "input directory '", input, "' holds no ",
                 format == CorpusFormat::brown ? "Brown corpus file (ca01 ... cr09)" : "file");
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
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
  LOOM_REQUIRE(fs::is_directory(opt.tokenizer_dir), "tokenizer directory '", opt.tokenizer_dir,
               "' does not exist (it should hold GPT-2's encoder.json and vocab.bpe; run scripts/fetch-data.sh)");
  const std::vector<std::string> files = expand_inputs(opt.inputs, opt.format);
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

  const Gpt2Tokenizer tok = Gpt2Tokenizer::load(opt.tokenizer_dir);
  summary.vocab_size = tok.vocab_size();
  summary.shard_version = shard_version_for_vocab(tok.vocab_size());
  const fs::path out = make_output_dir(opt.output_dir);
  ShardSink val(out, "val", opt.shard_tokens, summary.shard_version, summary.val);
  ShardSink train(out, "train", opt.shard_tokens, summary.shard_version, summary.train);

  // Documents are tokenised in parallel in groups and appended in input order.
  const int threads = std::max(1, opt.threads);
  const int64_t group = int64_t{threads} * 8;
  int64_t bytes_done = 0;
  for (int64_t begin = 0; begin < n; begin += group) {
    const int64_t end = std::min(n, begin + group);
    const std::vector<std::vector<int32_t>> docs = tokenize_group(tok, files, begin, end, opt.format, threads);
    for (int64_t i = begin; i < end; ++i) {
      (is_val[i] ? val : train).append(docs[i - begin]);
      bytes_done += bytes[i];
      if (opt.progress) opt.progress(bytes_done, summary.input_bytes);
    }
  }
  LOOM_REQUIRE(summary.val.tokens + summary.train.tokens > n, "data prepare: the input has no text (", n,
               " documents, ", summary.input_bytes, " bytes, no tokens)");
  val.finish();
  train.finish();
  return summary;
}

}  // namespace loom::text
