// loom data prepare: text corpus -> llm.c .bin token shards (text/prepare.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/threads.h"
#include "text/prepare.h"

namespace loom::cli {

namespace {

struct DataPrepareArgs {
  text::PrepareOptions prepare;
  bool json = false;
};

// A progress bar on stderr, redrawn at most 10 times a second and only when
// stderr is a terminal, so CI logs stay small.
std::function<void(int64_t, int64_t)> progress_bar() {
  if (!::isatty(STDERR_FILENO)) return {};
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [last](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done < total && now - *last < std::chrono::milliseconds(100)) return;
    *last = now;
    const int width = 40;
    const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\rdata prepare [%.*s%*s] %5.1f%% %.1f/%.1f MB", filled,
                 "########################################", width - filled, "", 100.0 * frac, done / 1e6, total / 1e6);
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

void print_split(const char* split, const text::SplitSummary& s, const text::PrepareSummary& all, double seconds,
                 bool json) {
  if (json) {
    const nlohmann::ordered_json line = {{"split", split},     {"documents", s.documents}, {"tokens", s.tokens},
                                 {"shards", s.files.size()}, {"shard_version", all.shard_version},
                                 {"input_bytes", all.input_bytes}, {"seconds", seconds}};
    std::printf("%s\n", line.dump().c_str());
    return;
  }
  std::printf("%-5s %6lld documents %12lld tokens in %zu shard(s)%s%s\n", split, static_cast<long long>(s.documents),
              static_cast<long long>(s.tokens), s.files.size(), s.files.empty() ? "" : ": ",
              s.files.empty() ? "" : (s.files.front() + (s.files.size() > 1 ? " ..." : "")).c_str());
}

}  // namespace

void add_data_command(CLI::App& app, int default_threads) {
  CLI::App* data = app.add_subcommand("data", "Prepare training data");
  data->require_subcommand(1);
  CLI::App* prepare = data->add_subcommand(
      "prepare",
      "Tokenise text files (GPT-2's BPE, or a Hugging Face tokenizer.json) into llm.c .bin shards: "
      "OUTPUT/val_000000.bin, OUTPUT/train_000000.bin, ... Each input file is one document, written as EOT (the BOS "
      "for a tokenizer that adds one) + its tokens; --val-fraction of the documents, spread evenly over the input "
      "order, go to val.");
  auto args = std::make_shared<DataPrepareArgs>();
  auto threads = std::make_shared<int>(default_threads);
  prepare->add_option("--tokenizer", args->prepare.tokenizer,
                      "a Hugging Face tokenizer.json (byte-level BPE), or a directory holding one or GPT-2's "
                      "encoder.json and vocab.bpe")
      ->required();
  prepare->add_option("--input", args->prepare.inputs,
                      "input files or directories (a directory: its files sorted by name); the output directory "
                      "and .bin token shards are skipped with a warning")
      ->required();
  prepare->add_option("--output", args->prepare.output_dir,
                      "output directory (created if missing), replaced as a whole by the new shards: written next "
                      "to it, then swapped in, so it holds the complete old or the complete new set; it may hold "
                      "nothing but shards")
      ->required();
  auto format = std::make_shared<std::string>("text");
  prepare->add_option("--format", *format,
                      "text: files as they are; brown: Brown corpus Form C, part-of-speech tags stripped (a "
                      "directory then means its ca01 ... cr09 files)")
      ->check(CLI::IsMember({"text", "brown"}))
      ->capture_default_str();
  prepare->add_option("--val-fraction", args->prepare.val_fraction, "fraction of the documents that go to val")
      ->check(CLI::Range(0.0, 0.999999))
      ->default_str("0.1");
  prepare->add_option("--shard-tokens", args->prepare.shard_tokens, "tokens per shard")
      ->check(CLI::Range(int64_t{1}, int64_t{INT32_MAX}))
      ->default_str("100000000");
  prepare->add_option("--threads", *threads,
                      "documents tokenised in parallel (default: the cores this process may use)")
      ->check(CLI::Range(1, 1024));
  prepare->add_flag("--json", args->json, "print JSON Lines, one object per split");
  prepare->callback([args, threads, format] {
    args->prepare.threads = *threads;
    args->prepare.format = *format == "brown" ? text::CorpusFormat::brown : text::CorpusFormat::text;
    args->prepare.progress = progress_bar();
    const auto start = std::chrono::steady_clock::now();
    const text::PrepareSummary summary = text::prepare_shards(args->prepare);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!args->json) {
      std::printf("data prepare: %lld bytes of input, vocabulary %lld (shard version %d), %.2f s\n",
                  static_cast<long long>(summary.input_bytes), static_cast<long long>(summary.vocab_size),
                  summary.shard_version, seconds);
    }
    print_split("val", summary.val, summary, seconds, args->json);
    print_split("train", summary.train, summary, seconds, args->json);
  });
}

}  // namespace loom::cli
