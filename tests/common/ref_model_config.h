// The ModelConfig a reference model case was written with (tests/ref/
// ref_model.py's config tensor: family, n_layer, n_embd, n_head, n_kv_head,
// d_ff, vocab_size, max_seq_len, tie; and norm_eps, rope_theta). Header only:
// the tests that read it link loom_model, the common test library does not.
#pragma once

#include <cstdint>
#include <vector>

#include "common/ref.h"
#include "model/config.h"

namespace loom::test {

inline model::ModelConfig model_config_of(RefCase& rc) {
  const std::vector<float> v = rc["config"].floats();
  model::ModelConfig c;
  c.family = v[0] == 0 ? model::Family::gpt2 : model::Family::llama;
  c.n_layer = int64_t(v[1]), c.n_embd = int64_t(v[2]), c.n_head = int64_t(v[3]), c.n_kv_head = int64_t(v[4]);
  c.d_ff = int64_t(v[5]), c.vocab_size = int64_t(v[6]), c.max_seq_len = int64_t(v[7]);
  c.tie_embeddings = v[8] != 0;
  c.norm_eps = rc["norm_eps"].scalar();
  c.rope_theta = rc["rope_theta"].scalar();
  return c;
}

}  // namespace loom::test
