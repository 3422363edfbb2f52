// Corpus -> token shards (`loom data prepare`): each input file is one
// document; a document is written as a delimiter followed by its tokens, as
// llm.c's data scripts do (dev/data/fineweb.py): the BOS where the tokenizer
// adds one to a text (Llama 3's <|begin_of_text|>), else the EOS (GPT-2's
// <|endoftext|>), so the delimiter separates documents.
// n_val = round(val_fraction * documents) documents, spread evenly over the
// input order (document i is val when floor((i+1) n_val / n) > floor(i n_val / n)),
// go to val_NNNNNN.bin; the rest to train_NNNNNN.bin, in input order. Spreading
// keeps every part of an ordered corpus (Brown's genres a-r) in val.
//
// The output directory is replaced as a whole (issue 15): the shards are
// written into a temporary directory next to it (.NAME.prepare-PID-N), which
// is then swapped in with one rename, so the output holds either the complete
// old shard set or the complete new one, and no shard of an earlier, longer
// run survives next to the new ones. Hence an existing output directory may
// hold only shards (val_NNNNNN.bin, train_NNNNNN.bin); anything else in it is
// an error rather than lost. A run killed before the swap leaves its
// temporary directory behind, and the old shards in place.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::text {

enum class CorpusFormat {
  text,   // a file is UTF-8 text, tokenised as it is (other bytes too, with a warning)
  brown,  // Brown corpus Form C: tags stripped by brown_to_text
};

struct PrepareOptions {
  std::string tokenizer;            // as text::load_tokenizer takes it (a tokenizer.json, or a dir with one or GPT-2's)
  std::vector<std::string> inputs;  // files or directories (see expand_inputs)
  std::string output_dir;           // created if missing; replaced by the new shards (see above)
  CorpusFormat format = CorpusFormat::text;
  double val_fraction = 0.1;
  int64_t shard_tokens = 100'000'000;  // tokens per shard; the last one of a split holds the rest
  int threads = 1;                     // documents tokenised in parallel
  // Called with (input bytes done, input bytes total) after each document.
  std::function<void(int64_t, int64_t)> progress;
  // Called with one line per warning (an input skipped, an input that does
  // not look like text); unset: log_warn.
  std::function<void(const std::string&)> warn;
};

struct SplitSummary {
  int64_t documents = 0;
  int64_t tokens = 0;  // delimiters included
  std::vector<std::string> files;
};

struct PrepareSummary {
  SplitSummary val;
  SplitSummary train;
  int64_t input_bytes = 0;
  int64_t vocab_size = 0;
  int shard_version = 0;
};

struct InputFiles {
  std::vector<std::string> files;    // in input order
  std::vector<std::string> skipped;  // one line per skipped input: which and why
};

// Files in input order; a directory stands for its regular files sorted by
// name (for brown: only Form C names, ca01 ... cr09, so the package's README,
// CONTENTS and package.json are skipped). Skipped, with a line in `skipped`:
// an input that is output_dir or lies inside it (data prepare's own output,
// e.g. a shell glob that caught it), a .bin token shard (by its magic), and
// a subdirectory of an input directory (not read: an input of its own reads it).
// Throws loom::Error for a missing input or a directory with no such file;
// `files` is empty when every input was skipped.
InputFiles expand_inputs(const std::vector<std::string>& inputs, CorpusFormat format,
                         const std::string& output_dir = {});

// Why `bytes` do not look like text, or empty when they do: NUL bytes (a text
// file has none), or more than kMaxNonUtf8Share of the bytes outside valid
// UTF-8 sequences (compressed or binary data; a Latin-1 text stays below).
inline constexpr double kMaxNonUtf8Share = 0.10;
std::string non_text_reason(std::string_view bytes);

// Which of n documents go to val (see the top of this file).
std::vector<bool> val_documents(int64_t n, double val_fraction);

// Throws loom::Error for a missing tokenizer, missing or empty input, a val
// fraction that leaves val or train empty, an output that is a file, holds
// anything but shards, or cannot be written. Warns (options.warn) about each
// skipped input and each input that does not look like text (non_text_reason).
PrepareSummary prepare_shards(const PrepareOptions& options);

}  // namespace loom::text
