#include "parallel/dp_layout.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace loom::parallel {

// ---- parameter groups ----

ParamPredicate params_named(std::vector<std::string> names) {
  return [names = std::move(names)](const model::ParamSpec& p) {
    return std::find(names.begin(), names.end(), p.name) != names.end();
  };
}

ParamPredicate all_params() {
  return [](const model::ParamSpec&) { return true; };
}

namespace {

std::string group_names(const std::vector<ParamGroup>& groups) {
  std::string out;
  for (const ParamGroup& g : groups) out += (out.empty() ? "'" : ", '") + g.name + "'";
  return out;
}

}  // namespace

std::vector<int> assign_param_groups(const std::vector<model::ParamSpec>& specs, const std::vector<ParamGroup>& groups) {
  LOOM_REQUIRE(!groups.empty(), "DataParallel: no parameter groups: every parameter must belong to one");
  for (size_t g = 0; g < groups.size(); ++g) {
    LOOM_REQUIRE(static_cast<bool>(groups[g].holds), "DataParallel: parameter group '", groups[g].name,
                 "' has no predicate saying which parameters it holds");
    for (size_t h = 0; h < g; ++h)
      LOOM_REQUIRE(groups[h].name != groups[g].name, "DataParallel: two parameter groups are named '",
                   groups[g].name, "': group names must differ");
  }
  std::vector<int> out(specs.size(), -1);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!groups[g].holds(specs[i])) continue;
      LOOM_REQUIRE(out[i] < 0, "DataParallel: parameter '", specs[i].name, "' is in two groups, '",
                   groups[static_cast<size_t>(out[i])].name, "' and '", groups[g].name,
                   "': each parameter must belong to exactly one");
      out[i] = static_cast<int>(g);
    }
    LOOM_REQUIRE(out[i] >= 0, "DataParallel: parameter '", specs[i].name, "' is in no group (groups ",
                 group_names(groups), "): each parameter must belong to exactly one");
  }
  return out;
}

void require_whole_units(const std::vector<model::ParamSpec>& specs, const std::vector<model::Unit>& units,
                         const std::vector<int>& group_of, const std::vector<ParamGroup>& groups, int zero_stage) {
  if (zero_stage < 2) return;
  size_t i = 0;
  for (const model::Unit& u : units) {
    const size_t first = i;
    for (; i < specs.size() && specs[i].offset < u.end; ++i) {
      if (group_of[i] == group_of[first]) continue;
      fail("DataParallel: parallel.zero_stage = ", zero_stage, " needs each unit's parameters in one group, but '",
           specs[first].name, "' (group '", groups[static_cast<size_t>(group_of[first])].name, "') and '",
           specs[i].name, "' (group '", groups[static_cast<size_t>(group_of[i])].name,
           "') share a unit; stages 0 and 1 allow it");
    }
  }
}

GroupSpace group_space(const std::vector<model::ParamSpec>& specs, const std::vector<model::Unit>& units,
                       const std::vector<int>& group_of, int group) {
  LOOM_CHECK(group_of.size() == specs.size(), "group_space: ", group_of.size(), " groups for ", specs.size(),
             " specs");
  GroupSpace s;
  size_t i = 0;
  for (const model::Unit& u : units) {
    s.units.push_back({s.numel, s.numel});
    for (; i < specs.size() && specs[i].offset < u.end; ++i) {
      if (group_of[i] != group) continue;
      const model::ParamSpec& p = specs[i];
      const int64_t n = p.numel();
      if (!s.runs.empty() && s.runs.back().flat + s.runs.back().count == p.offset) s.runs.back().count += n;
      else s.runs.push_back({s.numel, p.offset, n});
      s.specs.push_back(p);
      s.specs.back().offset = s.numel;
      s.flat.push_back(p.offset);
      s.numel += n;
    }
    s.units.back().end = s.numel;
  }
  LOOM_CHECK(i == specs.size(), "group_space: spec ", i, " lies past the last unit");
  return s;
}

bool is_one_run(const GroupSpace& s, int64_t index, int64_t count) {
  int runs = 0;
  for_each_flat_run(s, index, count, [&](int64_t, int64_t, int64_t) { ++runs; });
  return runs <= 1;
}

// ---- buckets ----

namespace {

// Stages 0-2: backward finishes units from the last to the first, so a
// bucket grows downwards from its last unit until it holds bucket_mb of f32
// gradients (or reaches the lowest unit with elements).
std::vector<Bucket> grow_buckets(const std::vector<model::Unit>& units, double bucket_mb) {
  const int n = static_cast<int>(units.size());
  int lowest = 0;
  while (lowest < n && units[lowest].numel() == 0) ++lowest;
  const double limit = bucket_mb * 1024.0 * 1024.0;
  std::vector<Bucket> out;
  int last = -1;  // the highest unit of the bucket growing, -1 before its first
  for (int u = n - 1; u >= lowest; --u) {
    if (units[u].numel() == 0) continue;
    if (last < 0) last = u;
    const double bytes = 4.0 * static_cast<double>(units[last].end - units[u].begin);
    if (bytes >= limit || u == lowest) {
      out.push_back({u, last, units[u].begin, units[last].end});
      last = -1;
    }
  }
  std::reverse(out.begin(), out.end());  // index order
  return out;
}

int unit_of(const std::vector<model::Unit>& units, int64_t element) {
  for (int u = 0; u < static_cast<int>(units.size()); ++u)
    if (element >= units[u].begin && element < units[u].end) return u;
  fail("make_buckets: element ", element, " is in no unit");
}

void require_solo_ranges(const std::vector<model::Unit>& units, const std::vector<model::Unit>& solo) {
  for (size_t i = 0; i < solo.size(); ++i) {
    const model::Unit& r = solo[i];
    LOOM_REQUIRE(r.begin < r.end && r.begin >= units.front().begin && r.end <= units.back().end &&
                     unit_of(units, r.begin) == unit_of(units, r.end - 1),
                 "make_buckets: solo range [", r.begin, ", ", r.end, ") must be non-empty and inside one unit");
    for (size_t j = 0; j < i; ++j)
      LOOM_REQUIRE(r.end <= solo[j].begin || solo[j].end <= r.begin, "make_buckets: solo ranges [", r.begin, ", ",
                   r.end, ") and [", solo[j].begin, ", ", solo[j].end, ") overlap");
  }
}

// Cuts solo range r (inside one unit, so inside one bucket of `buckets`) out
// of its bucket: up to three buckets, each whose lowest unit is the unit
// holding its first element.
void cut_solo(std::vector<Bucket>& buckets, const std::vector<model::Unit>& units, const model::Unit& r) {
  auto it = std::find_if(buckets.begin(), buckets.end(),
                         [&](const Bucket& b) { return r.begin >= b.begin && r.begin < b.end; });
  const Bucket b = *it;
  LOOM_CHECK(r.end <= b.end, "solo range crosses a bucket end");
  std::vector<Bucket> cut;
  if (b.begin < r.begin) cut.push_back({b.first_unit, unit_of(units, r.begin - 1), b.begin, r.begin});
  cut.push_back({unit_of(units, r.begin), unit_of(units, r.end - 1), r.begin, r.end});
  if (r.end < b.end) cut.push_back({unit_of(units, r.end), b.last_unit, r.end, b.end});
  it = buckets.erase(it);
  buckets.insert(it, cut.begin(), cut.end());
}

}  // namespace

std::vector<model::Unit> solo_ranges(const GroupSpace& space, const std::vector<std::string>& names) {
  std::vector<model::Unit> solo;
  for (const std::string& name : names) {
    const auto it = std::find_if(space.specs.begin(), space.specs.end(),
                                 [&](const model::ParamSpec& p) { return p.name == name; });
    if (it != space.specs.end()) solo.push_back({it->offset, it->offset + it->numel()});
  }
  return solo;
}

std::vector<Bucket> make_buckets(const std::vector<model::Unit>& units, int zero_stage, double bucket_mb,
                                 const std::vector<model::Unit>& solo) {
  LOOM_REQUIRE(!units.empty(), "make_buckets: no units");
  LOOM_REQUIRE(solo.empty() || zero_stage <= 1, "DataParallel: a parameter with a bucket of its own (a tied ",
               "embedding under pipeline parallelism) needs parallel.zero_stage 0 or 1, not ", zero_stage,
               ": from stage 2 a unit's gradients go to one bucket buffer");
  LOOM_REQUIRE(zero_stage >= 0 && zero_stage <= 3, "parallel.zero_stage = ", zero_stage,
               " is invalid: allowed values are 0, 1, 2, 3");
  LOOM_REQUIRE(bucket_mb > 0, "parallel.bucket_mb = ", bucket_mb, " is invalid: it must be > 0");
  std::vector<Bucket> out;
  if (zero_stage == 3) {  // FSDP's per-layer wrapping: a bucket per unit
    for (int u = 0; u < static_cast<int>(units.size()); ++u)
      if (units[u].numel() > 0) out.push_back({u, u, units[u].begin, units[u].end});
    return out;
  }
  out = grow_buckets(units, bucket_mb);
  require_solo_ranges(units, solo);
  for (const model::Unit& r : solo) cut_solo(out, units, r);  // disjoint: each inside one bucket made so far
  return out;
}

// ---- segments and pieces ----

std::vector<Segment> shard_segments(const std::vector<Bucket>& buckets, int zero_stage, int size, int rank) {
  LOOM_REQUIRE(size >= 1 && rank >= 0 && rank < size, "shard_segments: rank ", rank, " of ", size);
  std::vector<Segment> out;
  int64_t packed = 0;
  for (const Bucket& b : buckets) {
    const comm::Range r = zero_stage == 0 ? comm::Range{0, b.numel()} : comm::shard_range(b.numel(), size, rank);
    out.push_back({b.begin + r.offset, r.count, packed});
    packed += r.count;
  }
  return out;
}

std::vector<ParamPiece> segment_pieces(const std::vector<Segment>& segments,
                                       const std::vector<model::ParamSpec>& specs) {
  std::vector<ParamPiece> out;
  for (const Segment& s : segments)
    for_each_overlap(specs, s.offset, s.offset + s.count, [&](const model::ParamSpec& p, int64_t lo, int64_t hi) {
      out.push_back({lo, hi - lo, s.shard_offset + (lo - s.offset), p.shape.ndim() >= 2});
    });
  return out;
}

std::vector<ParamPiece> group_pieces(const std::vector<Segment>& segments, const GroupSpace& space) {
  std::vector<ParamPiece> out;
  for (const Segment& s : segments)
    for_each_overlap(space.specs, s.offset, s.offset + s.count, [&](const model::ParamSpec& p, int64_t lo, int64_t hi) {
      const int64_t flat = space.flat[static_cast<size_t>(&p - space.specs.data())] + (lo - p.offset);
      out.push_back({flat, hi - lo, s.shard_offset + (lo - s.offset), p.shape.ndim() >= 2});
    });
  return out;
}

namespace {

// zero_comm_peak's replay of DataParallel's comm buffers, hook call by call.
class CommReplay {
 public:
  CommReplay(const std::vector<model::Unit>& units, const std::vector<ZeroGroup>& groups,
             const std::vector<int>& unit_group, int zero_stage, int64_t param_bytes)
      : units_(units), groups_(groups), unit_group_(unit_group), zero_stage_(zero_stage), param_bytes_(param_bytes),
        unit_bucket_(units.size(), SIZE_MAX), gathered_(units.size(), false), refs_(units.size(), 0) {
    LOOM_CHECK(unit_group.size() == units.size(), "zero_comm_peak: ", unit_group.size(), " unit groups for ",
               units.size(), " units");
    for (size_t u = 0; u < units.size(); ++u) {
      const std::vector<Bucket>& buckets = group_of(static_cast<int>(u)).buckets;
      for (size_t b = 0; b < buckets.size(); ++b)
        if (buckets[b].first_unit <= static_cast<int>(u) && static_cast<int>(u) <= buckets[b].last_unit)
          unit_bucket_[u] = b;
    }
    for (const ZeroGroup& g : groups) open_.emplace_back(g.buckets.size(), false);
  }

  // One pass's calls. A bound unit computes between its acquires and its
  // first release (Model::hook_events): its first acquired unit names it.
  void pass(const std::vector<model::HookEvent>& events, bool backward, bool last_micro_batch,
            const std::function<int64_t(int, bool)>& computing) {
    using Call = model::HookEvent::Call;
    order_.clear();
    for (const model::HookEvent& e : events)
      if (e.call == Call::acquire_params) order_.push_back(e.unit);
    cursor_ = 0;
    int bound = -1;
    bool acquiring = false;
    for (const model::HookEvent& e : events) {
      const bool acquire = e.call == Call::acquire_params || e.call == Call::acquire_grads;
      if (acquire && !acquiring) bound = e.unit;
      if (!acquire && acquiring && computing) peak_ = std::max(peak_, now_ + computing(bound, backward));
      acquiring = acquire;
      if (e.call == Call::acquire_params && zero_stage_ == 3) acquire_params(e.unit);
      else if (e.call == Call::release_params && zero_stage_ == 3) release_params(e.unit);
      else if (e.call == Call::acquire_grads && zero_stage_ >= 2) acquire_grads(e.unit);
      else if (e.call == Call::grads_ready && zero_stage_ >= 2) grads_ready(e.unit);
      else if (e.call == Call::grads_ready && last_micro_batch) reduce_packed(e.unit);
    }
  }
  int64_t peak() const { return peak_; }

 private:
  static constexpr int64_t kF32 = 4;
  const ZeroGroup& group_of(int unit) const { return groups_.at(static_cast<size_t>(unit_group_[static_cast<size_t>(unit)])); }
  size_t bucket_of(int unit) const {
    const size_t b = unit_bucket_.at(static_cast<size_t>(unit));
    LOOM_CHECK(b != SIZE_MAX, "zero_comm_peak: unit ", unit, " is in no bucket");
    return b;
  }
  void add(int64_t bytes) { now_ += bytes, peak_ = std::max(peak_, now_); }
  // Stage 3: a unit's parameters gathered, and the pass's next one prefetched.
  void issue(int u) {
    if (!gathered_[static_cast<size_t>(u)]) gathered_[static_cast<size_t>(u)] = true, add(param_bytes_ * units_[u].numel());
  }
  void acquire_params(int unit) {
    issue(unit);
    ++refs_[static_cast<size_t>(unit)];
    if (cursor_ >= order_.size() || order_[cursor_] != unit)
      cursor_ = static_cast<size_t>(std::find(order_.begin(), order_.end(), unit) - order_.begin());
    if (++cursor_ < order_.size()) issue(order_[cursor_]);  // the prefetch
  }
  void release_params(int unit) {
    const auto u = static_cast<size_t>(unit);
    if (--refs_[u] == 0) gathered_[u] = false, now_ -= param_bytes_ * units_[u].numel();
  }
  // An empty unit (an adapted model's embeddings or head) is in no bucket:
  // DataParallel gives it no buffer and reduces nothing for it.
  void acquire_grads(int unit) {
    if (units_[unit].numel() == 0) return;
    const size_t b = bucket_of(unit);
    std::vector<bool>::reference is_open = open_[static_cast<size_t>(unit_group_[static_cast<size_t>(unit)])][b];
    if (!is_open) is_open = true, add(kF32 * group_of(unit).buckets[b].numel());
  }
  // The bucket's first unit finishes it: reduce-scattered into a piece (one
  // rank: added into the shard and freed); a third reduction of any group
  // retires the oldest.
  void grads_ready(int unit) {
    if (units_[unit].numel() == 0) return;
    const size_t b = bucket_of(unit);
    const ZeroGroup& g = group_of(unit);
    if (unit != g.buckets[b].first_unit) return;
    open_[static_cast<size_t>(unit_group_[static_cast<size_t>(unit)])][b] = false;
    if (g.size == 1) return (void)(now_ -= kF32 * g.buckets[b].numel());
    add(kF32 * g.segments[b].count);
    reducing_.push_back(kF32 * (g.buckets[b].numel() + g.segments[b].count));
    while (reducing_.size() > kMaxReductionsInFlight) now_ -= reducing_.front(), reducing_.erase(reducing_.begin());
  }

  // ZeRO 0 and 1: the buckets this unit finishes start their reductions
  // (groups of one rank reduce nothing).
  void reduce_packed(int unit) {
    for (const ZeroGroup& g : groups_) {
      if (g.size == 1 || g.packed.empty()) continue;
      for (size_t b = 0; b < g.buckets.size(); ++b)
        if (g.buckets[b].first_unit == unit) add(g.packed.at(b));
    }
  }

  const std::vector<model::Unit>& units_;
  const std::vector<ZeroGroup>& groups_;
  const std::vector<int>& unit_group_;
  int zero_stage_;
  int64_t param_bytes_;
  std::vector<size_t> unit_bucket_;
  std::vector<bool> gathered_;
  std::vector<int> refs_;
  std::vector<std::vector<bool>> open_;  // per group and bucket: its gradient buffer is open
  std::vector<int64_t> reducing_;        // the reductions in flight: their bytes
  std::vector<int> order_;               // the pass's acquire order, and the prefetch's place in it
  size_t cursor_ = 0;
  int64_t now_ = 0, peak_ = 0;
};

}  // namespace

int64_t zero_comm_peak(const std::vector<model::HookEvent>& forward, const std::vector<model::HookEvent>& backward,
                       const std::vector<model::Unit>& units, const std::vector<ZeroGroup>& groups,
                       const std::vector<int>& unit_group, int zero_stage, int micro_batches, int64_t param_bytes,
                       const std::function<int64_t(int unit, bool backward)>& computing) {
  CommReplay replay(units, groups, unit_group, zero_stage, param_bytes);
  // From the second micro-batch on every pass starts as the one before did
  // (the same two reductions in flight, nothing gathered or open), so two
  // give the peak of any number; ZeRO 0/1's reductions start in the last.
  const int passes = std::min(micro_batches, 2);
  for (int mb = 0; mb < passes; ++mb) {
    replay.pass(forward, false, false, computing);
    replay.pass(backward, true, mb == passes - 1, computing);
  }
  return replay.peak();
}

}  // namespace loom::parallel
