// gguf_describe FILE.gguf: loom's reader's canonical JSON of a GGUF file
// (io::gguf_describe_json), for comparison with @huggingface/gguf's parse
// (tests/interop/gguf_hf_parse.mjs). Exit 1 with the message if loom refuses it.
#include <cstdio>
#include <exception>

#include "io/gguf.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: gguf_describe FILE.gguf\n");
    return 2;
  }
  try {
    std::printf("%s\n", loom::io::gguf_describe_json(loom::io::GgufFile::open(argv[1])).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_describe: %s\n", e.what());
    return 1;
  }
  return 0;
}
