// Corpus -> token shards (`loom data prepare`): each input file is one
// document; a document is written as EOT followed by its tokens, as llm.c's
// data scripts do (dev/data/fineweb.py), so EOT separates documents.
// n_val = round(val_fraction * documents) documents, spread evenly over the
// input order (document i is val when floor((i+1) n_val / n) > floor(i n_val / n)),
// go to val_NNNNNN.bin; the rest to train_NNNNNN.bin, in input order. Spreading
// keeps every part of an ordered corpus (Brown's genres a-r) in val.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::text {

enum class CorpusFormat {
  text,   // a file is UTF-8 (or any bytes) text, tokenised as it is
  brown,  // Brown corpus Form C: tags stripped by brown_to_text
};

struct PrepareOptions {
  std::string tokenizer_dir;        // encoder.json + vocab.bpe
  std::vector<std::string> inputs;  // files or directories (see expand_inputs)
  std::string output_dir;           // created if missing
  CorpusFormat format = CorpusFormat::text;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;  // tokens per shard; the last one of a split holds the rest
  int threads = 1;                     // documents tokenised in parallel
  // Called with (input bytes done, input bytes total) after each document.
  std::function<void(int64_t, int64_t)> progress;
};

struct SplitSummary {
  int64_t documents = 0;
  int64_t tokens = 0;  // EOTs included
  std::vector<std::string> files;
};

struct PrepareSummary {
  SplitSummary val;
  SplitSummary train;
  int64_t input_bytes = 0;
  int64_t vocab_size = 0;
  int shard_version = 0;
};

// Files in input order; a directory stands for its regular files sorted by
// name (for brown: only Form C names, ca01 ... cr09, so the package's README,
// CONTENTS and package.json are skipped). Throws loom::Error for a missing
// input or a directory with no such file.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs, CorpusFormat format);

// Which of n documents go to val (see the top of this file).
std::vector<bool> val_documents(int64_t n, double val_fraction);

// Throws loom::Error for a missing tokenizer, missing or empty input, a val
// fraction that leaves val or train empty, and an unwritable output.
PrepareSummary prepare_shards(const PrepareOptions& options);

}  // namespace loom::text
