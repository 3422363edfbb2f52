#include "parallel/pp_tied.h"

#include "core/error.h"
#include "kernels/ops.h"

namespace loom::parallel {
namespace {

// One of the two copies: stage 0 without the head, or the last stage
// without the embedding (a chunk with both reads its one table).
bool holds_copy(const model::Model& chunk) { return chunk.has_embedding() != chunk.has_head(); }

}  // namespace

TiedEmbedding::TiedEmbedding(const model::ModelConfig& cfg, comm::Communicator& pp)
    : tied_(cfg.tie_embeddings), name_(name(cfg)) {
  if (!tied_ || pp.size() == 1) return;
  const bool member = pp.rank() == 0 || pp.rank() == pp.size() - 1;
  group_ = pp.split(member ? 0 : 1, pp.rank(), "embedding");
}

TiedEmbedding::~TiedEmbedding() = default;

std::string TiedEmbedding::name(const model::ModelConfig& cfg) {
  return cfg.family == model::Family::gpt2 ? "wte.weight" : "model.embed_tokens.weight";
}

std::vector<std::string> TiedEmbedding::solo_params(const model::Model& chunk) const {
  if (!tied_) return {};
  return solo_params(chunk.config(), chunk.has_embedding(), chunk.has_head());
}

std::vector<std::string> TiedEmbedding::solo_params(const model::ModelConfig& cfg, bool has_embedding,
                                                    bool has_head) {
  if (!cfg.tie_embeddings || has_embedding == has_head) return {};  // untied, or one chunk reads its one table
  return {name(cfg)};
}

void TiedEmbedding::sum_grads(const std::vector<model::Model*>& chunks, const std::vector<DataParallel*>& dps) {
  if (!tied_) return;
  LOOM_REQUIRE(chunks.size() == dps.size(), "TiedEmbedding::sum_grads: ", chunks.size(), " chunks but ", dps.size(),
               " DataParallels");
  // This rank's piece of the embedding's own bucket, in chunk c's gradients.
  auto piece = [&](size_t c) {
    const Segment s = dps[c]->solo_piece(name_);
    return chunks[c]->grads().slice(0, s.offset, s.count);
  };
  int first = -1, last = -1;
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (!holds_copy(*chunks[c])) continue;
    (chunks[c]->has_embedding() ? first : last) = static_cast<int>(c);
  }
  if (first >= 0 && last >= 0) {  // both copies on this rank (pp = 1 with virtual stages)
    const Tensor a = piece(static_cast<size_t>(first)), b = piece(static_cast<size_t>(last));
    kernels::add(a, a, b);
    kernels::cast(b, a);
    return;
  }
  const int mine = first >= 0 ? first : last;
  if (mine >= 0 && group_ != nullptr && group_->size() == 2)
    group_->all_reduce(piece(static_cast<size_t>(mine)), comm::ReduceOp::sum)->wait();
}

}  // namespace loom::parallel
