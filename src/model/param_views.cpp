// ParamViews (blocks.h): a parameter or gradient buffer's tensors by name.
#include "core/error.h"
#include "model/blocks.h"
#include "model/family.h"

namespace loom::model {

ParamViews::ParamViews(const std::vector<ParamSpec>& specs, Tensor flat) : ranges_{{flat, 0}} {
  for (const ParamSpec& s : specs) index_.emplace(s.name, &s);
}

Tensor ParamViews::operator()(const std::string& name) const {
  if (auto sub = substitutes_.find(name); sub != substitutes_.end()) return sub->second;
  auto it = index_.find(name);
  LOOM_CHECK(it != index_.end(), "no parameter ", name);
  const ParamSpec& spec = *it->second;
  for (const Range& r : ranges_)
    if (r.flat.defined() && spec.offset >= r.base && spec.offset + spec.numel() <= r.base + r.flat.numel())
      return r.flat.slice(0, spec.offset - r.base, spec.numel()).reshape(spec.shape);
  LOOM_CHECK(false, "parameter ", name, " is outside the bound units");
  return Tensor();
}

bool ParamViews::has(const std::string& name) const { return index_.count(name) > 0; }

LayerWeights ParamViews::layer(const ModelConfig& cfg, int64_t i) const {
  return block_family(cfg.family).bind_layer(*this, i);
}

HeadWeights ParamViews::head(const ModelConfig& cfg, bool embeddings, bool head) const {
  const ParamViews& v = *this;
  const BlockFamily& f = block_family(cfg.family);
  HeadWeights h;
  if (embeddings) {
    h.wte = v(f.embedding_name);
    if (f.position_name) h.wpe = v(f.position_name);
  }
  if (head) {
    if (f.final_bias_name) h.normf_b = v(f.final_bias_name);
    h.normf_w = v(f.final_norm_name);
    // A later stage's own copy of wte when tied (params.h PpStage).
    h.lm_head = v(cfg.tie_embeddings ? f.embedding_name : "lm_head.weight");
  }
  return h;
}

}  // namespace loom::model
