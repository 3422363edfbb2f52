// Embeddings on `loom serve` (generation.h's formats, for requests that
// sample nothing): POST /v1/embeddings (OpenAI), /api/embed and the older
// /api/embeddings (ollama). Each input is one engine request with the
// model's pooling (ServedModel::embedding_pooling: the final hidden states,
// after the last norm, averaged over the input's tokens or the last one's),
// then:
// - OpenAI: input a string, a list of strings, a list of token ids or a list
//   of such lists (up to 2048 inputs, none empty); the vector scaled to unit
//   length (as OpenAI's and vLLM's are); dimensions (< the model's width:
//   the first ones, scaled to unit length again, as OpenAI's text-embedding-3
//   shortens); encoding_format float or base64 (little-endian f32, what the
//   official clients ask for by default); an input longer than the context
//   is a 400 naming both lengths. {"object": "list", "data": [{"object":
//   "embedding", "index", "embedding"}], "model", "usage"}.
// - /api/embed: input a string or a list of strings; unit length;
//   truncate (default true: an input is cut to the context, options.num_ctx
//   or the model's; false: a 400); dimensions as above; keep_alive. An empty
//   input only loads the model. {"model", "embeddings", "total_duration",
//   "load_duration", "prompt_eval_count"}.
// - /api/embeddings: prompt, one string; the vector as the model makes it
//   (not scaled), as ollama's older route returns it. {"embedding"}.
// The inputs of one request run a few at a time (max_in_flight), so a batch
// of thousands never fills the server's queue. Errors use each API's
// envelope.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "serve/generation.h"
namespace loom::serve {

enum class EmbedRoute { openai, ollama_embed, ollama_embeddings };

class EmbeddingFormat : public GenerationFormat {
 public:
  EmbeddingFormat(nlohmann::ordered_json body, EmbedRoute route, std::string id);
  // The checks that need no model (field types and ranges): ApiError before
  // the request waits for a load.
  void precheck() const;
  CompletionRequest parse(const LoadedModel& m, uint64_t seed) override;
  bool generates() const override;
  void loaded(const LoadedModel& m, std::string& out) override;
  void begin(const CompletionRequest& r, const LoadedModel& m, std::string& out) override;
  void add(int64_t p, const std::vector<Delta>& deltas, std::string& out) override;
  void end(const GenerationTimes& t, std::string& out) override;
  std::string error_body(const ApiError& e, bool begun) const override;
  nlohmann::json usage() const override;
  std::string id() const override { return id_; }
  size_t max_in_flight() const override { return 32; }

 private:
  std::vector<std::vector<int32_t>> inputs(const LoadedModel& m) const;
  nlohmann::ordered_json body_;
  const EmbedRoute route_;
  const std::string id_;
  std::string model_;
  int64_t dimensions_ = 0;  // 0: the model's width
  bool base64_ = false;
  int64_t prompt_tokens_ = 0;
  std::vector<std::vector<float>> vectors_;  // per input, as they finish
};

// v scaled to unit Euclidean length (a zero vector stays zero).
std::vector<float> unit_length(std::vector<float> v);
// The f32 values' little-endian bytes in base64 (RFC 4648, with padding).
std::string base64_floats(const std::vector<float>& v);

}  // namespace loom::serve
