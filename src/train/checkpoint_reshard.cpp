#include "train/checkpoint_reshard.h"

#include <algorithm>

#include "core/error.h"

namespace loom::train {
namespace {

// Calls fn(piece, lo, hi) for each piece of `sorted` (by offset, disjoint,
// no empty ones) that overlaps [lo, hi), with the overlap.
template <typename Fn>
void for_each_overlap(const std::vector<Piece>& sorted, int64_t lo, int64_t hi, Fn&& fn) {
  auto it = std::upper_bound(sorted.begin(), sorted.end(), lo,
                             [](int64_t v, const Piece& p) { return v < p.offset; });
  if (it != sorted.begin()) --it;
  for (; it != sorted.end() && it->offset < hi; ++it) {
    const int64_t a = std::max(lo, it->offset), b = std::min(hi, it->offset + it->count);
    if (a < b) fn(*it, a, b);
  }
}

// The saved tp ranks' runs of parameter j of saved space st, by global
// offset (replicated parameters: tp rank 0's only; padding runs left out).
std::vector<Piece> saved_sources(const SavedLayout& saved, int st, size_t j) {
  const std::vector<std::vector<model::ParamSpec>>& held = saved.specs[st];
  std::vector<Piece> sources;
  for (int r = 0; r < (held[0][j].replicated() ? 1 : saved.tp); ++r)
    for (const model::ShardRun& run : model::shard_runs(held[r][j]))
      if (run.global >= 0) sources.push_back({run.global, run.count, held[r][j].offset + run.local, r});
  sort_pieces(sources);
  return sources;
}

// Appends r, merged into the last read when contiguous in both buffers.
void push_read(std::vector<Read>& reads, const Read& r) {
  Read* last = reads.empty() ? nullptr : &reads.back();
  if (last && last->shard == r.shard && last->src + last->count == r.src && last->dst + last->count == r.dst)
    last->count += r.count;  // contiguous in both: one read
  else
    reads.push_back(r);
}

}  // namespace

void sort_pieces(std::vector<Piece>& pieces) {
  std::erase_if(pieces, [](const Piece& p) { return p.count == 0; });
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
}

std::vector<Piece> pieces_of(const std::vector<parallel::Segment>& segments, int file) {
  std::vector<Piece> pieces;
  for (const parallel::Segment& s : segments) pieces.push_back({s.offset, s.count, s.shard_offset, file});
  sort_pieces(pieces);
  return pieces;
}

std::vector<SavedGroup> checkpoint_groups(const std::vector<model::ParamSpec>& flat, int ep) {
  std::vector<SavedGroup> groups{{parallel::kDenseGroup, {}, {}}};
  if (ep > 1) groups.push_back({parallel::kExpertGroup, {}, {}});
  std::vector<int64_t> numel(groups.size(), 0);
  for (const model::ParamSpec& spec : flat) {
    const size_t g = parallel::in_expert_group(spec.name, ep) ? 1 : 0;
    groups[g].specs.push_back(spec);
    groups[g].specs.back().offset = numel[g];
    groups[g].flat.push_back(spec.offset);
    numel[g] += spec.numel();
  }
  return groups;
}

int find_saved_space(const SavedLayout& s, int64_t stage, const std::string& group, int ep_rank) {
  for (size_t i = 0; i < s.spaces.size(); ++i) {
    const SavedLayout::Space& sp = s.spaces[i];
    if (sp.stage == stage && sp.group == group && (group != parallel::kExpertGroup || sp.ep_rank == ep_rank))
      return static_cast<int>(i);
  }
  return -1;
}

int add_saved_space(SavedLayout& s, SavedLayout::Space space, std::vector<std::vector<model::ParamSpec>> ranks) {
  const int index = static_cast<int>(s.specs.size());
  for (size_t i = 0; i < ranks[0].size(); ++i) {
    const model::ParamSpec& spec = ranks[0][i];
    if (spec.pp_copy) continue;
    LOOM_CHECK(s.by_name.emplace(spec.name, std::make_pair(index, i)).second, "load_checkpoint: parameter '",
               spec.name, "' is in two saved stages or groups");
  }
  s.segments.emplace_back(ranks.size());
  s.specs.push_back(std::move(ranks));
  s.spaces.push_back(std::move(space));
  return index;
}

int add_saved_shard(SavedLayout& s, const SavedShardInfo& shard, const std::vector<parallel::Segment>& segments) {
  LOOM_CHECK(shard.space >= 0 && shard.space < static_cast<int>(s.segments.size()) && shard.tp_rank >= 0 &&
                 shard.tp_rank < static_cast<int>(s.segments[shard.space].size()),
             "add_saved_shard: space ", shard.space, " tp rank ", shard.tp_rank, " has no specs");
  const int index = static_cast<int>(s.shards.size());
  std::vector<Piece>& held = s.segments[shard.space][shard.tp_rank];
  for (const parallel::Segment& g : segments) held.push_back({g.offset, g.count, g.shard_offset, index});
  const auto known = std::find(s.files.begin(), s.files.end(), shard.file);
  const int open = static_cast<int>(known - s.files.begin());
  if (known == s.files.end()) s.files.push_back(shard.file);
  s.shards.push_back({shard.file, shard.prefix, shard.numel, open});
  return index;
}

void sort_saved_segments(SavedLayout& s) {
  for (std::vector<std::vector<Piece>>& space : s.segments)
    for (std::vector<Piece>& rank : space) sort_pieces(rank);
}

// For each run of global elements of each parameter: the saved tp rank's
// pieces holding them (sources), then this rank's segments covering their
// new flat offsets (mine), then the saved shards holding their saved flat
// offsets.
ReadPlan plan_reads(const std::vector<model::ParamSpec>& specs, const std::vector<parallel::Segment>& segments,
                    const SavedLayout& saved) {
  const std::vector<Piece> mine = pieces_of(segments);
  ReadPlan plan;
  for (const model::ParamSpec& spec : specs) {
    const auto found = saved.by_name.find(spec.name);
    LOOM_CHECK(found != saved.by_name.end(), "load_checkpoint: parameter '", spec.name, "' is in no saved space");
    const auto [st, j] = found->second;
    const std::vector<Piece> sources = saved_sources(saved, st, j);
    for (const model::ShardRun& run : model::shard_runs(spec)) {
      const int64_t flat = spec.offset + run.local;
      if (run.global < 0) {
        for_each_overlap(mine, flat, flat + run.count, [&](const Piece&, int64_t lo, int64_t hi) { plan.padding += hi - lo; });
        continue;
      }
      for_each_overlap(sources, run.global, run.global + run.count, [&](const Piece& src, int64_t lo, int64_t hi) {
        const int64_t saved_flat = src.shard_offset + (lo - src.offset), new_flat = flat + (lo - run.global);
        for_each_overlap(mine, new_flat, new_flat + (hi - lo), [&](const Piece& seg, int64_t a, int64_t b) {
          const int64_t from = saved_flat + (a - new_flat), dst = seg.shard_offset + (a - seg.offset);
          for_each_overlap(saved.segments[st][src.file], from, from + (b - a), [&](const Piece& file, int64_t x, int64_t y) {
            push_read(plan.reads, {file.file, file.shard_offset + (x - file.offset), dst + (x - from), y - x});
          });
        });
      });
    }
  }
  return plan;
}

}  // namespace loom::train
