#include "parallel/dp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>

#include "core/error.h"
#include "kernels/ops.h"

namespace loom::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The first spec that ends after flat element `offset`: specs are packed in
// offset order, so a binary search.
std::vector<model::ParamSpec>::const_iterator first_spec_after(const std::vector<model::ParamSpec>& specs,
                                                              int64_t offset) {
  return std::partition_point(specs.begin(), specs.end(),
                              [&](const model::ParamSpec& p) { return p.offset + p.numel() <= offset; });
}

// Calls f(spec, lo, hi) for every spec overlapping flat elements [begin, end),
// with the overlap [lo, hi), in offset order: O(log specs + overlaps), so a
// loop over buckets or segments stays linear in the model's parameters.
template <typename F>
void for_each_overlap(const std::vector<model::ParamSpec>& specs, int64_t begin, int64_t end, F f) {
  for (auto it = first_spec_after(specs, begin); it != specs.end() && it->offset < end; ++it) {
    const int64_t lo = std::max(begin, it->offset), hi = std::min(end, it->offset + it->numel());
    if (lo < hi) f(*it, lo, hi);
  }
}

int64_t bytes_of(const Tensor& t) { return t.numel() * static_cast<int64_t>(dtype_size(t.dtype())); }

// all_gather only moves bytes: f16 parameters travel as bf16 of the same
// size (the communicator's dtypes are f32, bf16, i32, i64).
Tensor gather_view(const Tensor& t) {
  return t.dtype() == DType::f16 ? Tensor(t.data(), DType::bf16, t.shape()) : t;
}

}  // namespace

std::vector<Bucket> make_buckets(const std::vector<model::Unit>& units, int zero_stage, double bucket_mb,
                                 const std::vector<model::Unit>& solo) {
  LOOM_REQUIRE(!units.empty(), "make_buckets: no units");
  LOOM_REQUIRE(solo.empty() || zero_stage <= 1, "DataParallel: a parameter with a bucket of its own (a tied ",
               "embedding under pipeline parallelism) needs parallel.zero_stage 0 or 1, not ", zero_stage,
               ": from stage 2 a unit's gradients go to one bucket buffer");
  LOOM_REQUIRE(zero_stage >= 0 && zero_stage <= 3, "parallel.zero_stage = ", zero_stage,
               " is invalid: allowed values are 0, 1, 2, 3");
  LOOM_REQUIRE(bucket_mb > 0, "parallel.bucket_mb = ", bucket_mb, " is invalid: it must be > 0");
  const int n = static_cast<int>(units.size());
  std::vector<Bucket> out;
  if (zero_stage == 3) {
    for (int u = 0; u < n; ++u) out.push_back({u, u, units[u].begin, units[u].end});
    return out;
  }
  // Backward finishes units from the last to the first: a bucket grows
  // downwards from its last unit until it holds bucket_mb of f32 gradients.
  const double limit = bucket_mb * 1024.0 * 1024.0;
  int last = n - 1;
  for (int u = n - 1; u >= 0; --u) {
    const double bytes = 4.0 * static_cast<double>(units[last].end - units[u].begin);
    if (bytes >= limit || u == 0) {
      out.push_back({u, last, units[u].begin, units[last].end});
      last = u - 1;
    }
  }
  std::reverse(out.begin(), out.end());  // flat order
  if (solo.empty()) return out;
  // Cut each solo range out of its bucket: up to three buckets, each whose
  // lowest unit is the unit holding its first element.
  auto unit_of = [&](int64_t element) {
    for (int u = 0; u < n; ++u)
      if (element >= units[u].begin && element < units[u].end) return u;
    fail("make_buckets: element ", element, " is in no unit");
  };
  for (size_t i = 0; i < solo.size(); ++i) {
    const model::Unit& r = solo[i];
    LOOM_REQUIRE(r.begin < r.end && r.begin >= units.front().begin && r.end <= units.back().end &&
                     unit_of(r.begin) == unit_of(r.end - 1),
                 "make_buckets: solo range [", r.begin, ", ", r.end, ") must be non-empty and inside one unit");
    for (size_t j = 0; j < i; ++j)
      LOOM_REQUIRE(r.end <= solo[j].begin || solo[j].end <= r.begin, "make_buckets: solo ranges [", r.begin, ", ",
                   r.end, ") and [", solo[j].begin, ", ", solo[j].end, ") overlap");
  }
  for (const model::Unit& r : solo) {
    // Disjoint ranges inside one unit: r lies inside one bucket made so far.
    auto it = std::find_if(out.begin(), out.end(), [&](const Bucket& b) { return r.begin >= b.begin && r.begin < b.end; });
    const Bucket b = *it;
    LOOM_CHECK(r.end <= b.end, "solo range crosses a bucket end");
    std::vector<Bucket> cut;
    if (b.begin < r.begin) cut.push_back({b.first_unit, unit_of(r.begin - 1), b.begin, r.begin});
    cut.push_back({unit_of(r.begin), unit_of(r.end - 1), r.begin, r.end});
    if (r.end < b.end) cut.push_back({unit_of(r.end), b.last_unit, r.end, b.end});
    it = out.erase(it);
    out.insert(it, cut.begin(), cut.end());
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

model::Storage DataParallel::model_storage(int zero_stage) {
  model::Storage s;
  s.master = false;
  s.grads = zero_stage < 2;
  s.params = zero_stage < 3;
  return s;
}

struct DataParallel::Impl {
  explicit Impl(Pools& p) : pools(p) {}
  Pools& pools;
  std::vector<int> unit_bucket;  // unit -> bucket (stages 2 and 3: one bucket per unit)
  std::vector<std::vector<int>> finishes;  // unit -> the buckets whose lowest unit it is
  std::vector<ParamPiece> pieces;
  bool communicate = true;  // stages 0 and 1: this micro-batch's backward reduces (the last one)
  // Stages 0 and 1: the collectives of this step, waited for in grad_norm().
  std::vector<comm::WorkPtr> pending;
  // Stages 2 and 3: one gradient buffer per bucket while backward fills it,
  // then while its reduce_scatter runs.
  struct GradBuffer {
    OwnedTensor buf, piece;  // the bucket's gradients, this rank's reduced piece
    comm::WorkPtr work;
    int bucket = -1;
  };
  std::vector<OwnedTensor> open;  // by bucket: acquired, not yet finished
  std::deque<GradBuffer> reducing;
  // Stage 3: gathered parameters of each unit.
  struct Gathered {
    OwnedTensor buf;
    comm::WorkPtr work;
    int refs = 0;
  };
  std::vector<Gathered> gathered;
  std::vector<int> order[2];  // the units forward / backward acquires, in order
  size_t cursor[2] = {0, 0};
};

DataParallel::DataParallel(model::Model& model, comm::Communicator* comm, const DpOptions& options,
                           const AdamWOptions& adamw, Pools& pools)
    : opt_(options), adamw_(adamw), model_(model), comm_(comm) {
  if (comm_ != nullptr) rank_ = comm_->rank(), size_ = comm_->size();
  if (size_ == 1) comm_ = nullptr;
  const int stage = opt_.zero_stage;
  const model::Storage want = model_storage(stage), has = model.storage();
  LOOM_REQUIRE(has.params == want.params && has.grads == want.grads && has.master == want.master,
               "DataParallel: the model was not built with DataParallel::model_storage(", stage, ")");
  std::vector<model::Unit> solo;
  for (const std::string& name : opt_.solo_params) {
    const std::vector<model::ParamSpec>& specs = model.param_specs();
    auto it = std::find_if(specs.begin(), specs.end(), [&](const model::ParamSpec& p) { return p.name == name; });
    LOOM_REQUIRE(it != specs.end(), "DataParallel: solo parameter '", name, "' is not a parameter of the model");
    solo.push_back({it->offset, it->offset + it->numel()});
  }
  buckets_ = make_buckets(model.units(), stage, opt_.bucket_mb, solo);
  segments_ = shard_segments(buckets_, stage, size_, rank_);
  for (const Segment& s : segments_) shard_numel_ += s.count;
  impl_ = std::unique_ptr<Impl>(new Impl{pools});
  Impl& im = *impl_;
  im.unit_bucket.assign(model.units().size(), 0);
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    for (int u = buckets_[b].first_unit; u <= buckets_[b].last_unit; ++u) im.unit_bucket[u] = b;
  im.finishes.resize(model.units().size());
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) im.finishes[buckets_[b].first_unit].push_back(b);
  im.pieces = segment_pieces(segments_, model.param_specs());
  im.open.resize(buckets_.size());
  im.gathered.resize(model.units().size());
  // The order the model acquires units' parameters (model.h), for prefetching:
  // forward [embeddings], layers, [head] (a tied head reads unit 0 again);
  // backward [head (+ unit 0 when tied)], the layers in reverse (the
  // embedding's backward reads no parameters). A pipeline stage has only
  // some of these parts.
  const int U = static_cast<int>(model.units().size());
  const bool emb = model.has_embedding(), head = model.has_head();
  const bool tied_here = model.config().tie_embeddings && emb && head;
  const int first_layer = emb ? 1 : 0, last_layer = head ? U - 2 : U - 1;
  for (int u = 0; u < U; ++u) im.order[0].push_back(u);
  if (tied_here) im.order[0].push_back(0);
  if (head) im.order[1].push_back(U - 1);
  if (tied_here) im.order[1].push_back(0);
  for (int u = last_layer; u >= first_layer; --u) im.order[1].push_back(u);

  const int64_t S = shard_numel_;
  const DType compute = model.compute_dtype();
  // The shard state allocated below, beside what the pools hold already
  // (the model) and the model's bookkeeping, is checked first: a run too
  // large is refused with a message instead of killed by the OS.
  const bool master = compute != DType::f32 || opt_.offload_optimizer;
  const int f32_arrays = 2 + (master ? 1 : 0) + (stage >= 2 ? 1 : 0) + (opt_.offload_optimizer ? 1 : 0);
  const double per_param = 4.0 * f32_arrays + (stage == 3 ? static_cast<double>(dtype_size(compute)) : 0.0);
  model::require_fits_memory(pools, static_cast<double>(S) * per_param + static_cast<double>(model.memory().host),
                             concat("the optimizer state of ", S, " parameters on this rank (AdamW moments",
                                    master ? ", master weights" : "", stage >= 2 ? ", gradient shard" : "",
                                    stage == 3 ? ", parameter shard" : "", ") and the model's bookkeeping"),
                             "lower model.n_layer or model.n_embd, or shard it over more ranks (parallel.zero_stage "
                             ">= 1 with parallel.dp > 1, parallel.tp, parallel.pp)");
  if (master) master_ = pools[MemTag::master].zeros(DType::f32, {S});
  m_ = pools[MemTag::optimizer].zeros(DType::f32, {S});
  v_ = pools[MemTag::optimizer].zeros(DType::f32, {S});
  if (stage >= 2) grad_shard_ = pools[MemTag::grads].zeros(DType::f32, {S});
  if (stage == 3) param_shard_ = pools[MemTag::params].zeros(compute, {S});
  if (opt_.offload_optimizer) host_grads_ = pools[MemTag::optimizer].zeros(DType::f32, {S});
  model.set_hooks(this);
}

DataParallel::~DataParallel() {
  model_.set_hooks(nullptr);
  // Outstanding collectives read buffers freed below: finish them first.
  try {
    for (auto& w : impl_->pending) w->wait();
    for (auto& g : impl_->reducing) g.work->wait();
    for (auto& g : impl_->gathered)
      if (g.work) g.work->wait();
  } catch (...) {
  }
}

int DataParallel::solo_bucket(const std::string& name) const {
  LOOM_REQUIRE(std::find(opt_.solo_params.begin(), opt_.solo_params.end(), name) != opt_.solo_params.end(),
               "DataParallel: '", name, "' has no bucket of its own (DpOptions::solo_params)");
  const std::vector<model::ParamSpec>& specs = model_.param_specs();
  const auto spec = std::find_if(specs.begin(), specs.end(), [&](const model::ParamSpec& p) { return p.name == name; });
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b)
    if (buckets_[b].begin == spec->offset) return b;
  LOOM_CHECK(false, "solo parameter ", name, " starts no bucket");
}

void DataParallel::init_params(uint64_t seed) {
  // One bucket at a time (buckets hold whole parameters): the temporary is
  // the largest bucket, not the whole model, so ZeRO-3 never materialises it.
  const std::vector<model::ParamSpec>& specs = model_.param_specs();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bk = buckets_[b];
    OwnedTensor full = impl_->pools[MemTag::workspace].empty(DType::f32, {bk.numel()});
    for_each_overlap(specs, bk.begin, bk.end, [&](const model::ParamSpec& spec, int64_t, int64_t) {
      if (spec.offset < bk.begin) return;  // an earlier bucket's
      model::init_param(Tensor(full).slice(0, spec.offset - bk.begin, spec.numel()).reshape(spec.shape), spec, seed);
    });
    if (opt_.zero_stage < 3) kernels::cast(model_.params().slice(0, bk.begin, bk.numel()), full);  // every rank
    const Segment& s = segments_[b];
    const Tensor src = Tensor(full).slice(0, s.offset - bk.begin, s.count);
    if (master_.defined()) kernels::cast(Tensor(master_).slice(0, s.shard_offset, s.count), src);
    if (param_shard_.defined()) kernels::cast(Tensor(param_shard_).slice(0, s.shard_offset, s.count), src);
  }
}

void DataParallel::zero_grads() {
  if (opt_.zero_stage < 2) model_.zero_grads();
  else kernels::fill(grad_shard_, 0.f);
}

void DataParallel::begin_micro_batch(bool last) { impl_->communicate = last; }

// ---- gradients ----

Tensor DataParallel::acquire_grads(int unit) {
  Impl& im = *impl_;
  LOOM_CHECK(opt_.zero_stage >= 2, "acquire_grads under ZeRO stage ", opt_.zero_stage);
  const int b = im.unit_bucket[unit];
  const Bucket& bk = buckets_[b];
  if (!im.open[b].defined()) im.open[b] = im.pools[MemTag::comm].zeros(DType::f32, {bk.numel()});
  const model::Unit& u = model_.units()[unit];
  return Tensor(im.open[b]).slice(0, u.begin - bk.begin, u.numel());
}

void DataParallel::grads_ready(int unit) {
  Impl& im = *impl_;
  if (opt_.zero_stage < 2) {
    if (!im.communicate || comm_ == nullptr) return;
    const Tensor grads = model_.grads();
    for (int b : im.finishes[unit]) {  // the buckets whose lowest unit this is
      const Bucket& bk = buckets_[b];
      const Segment& seg = segments_[b];
      const Tensor in = grads.slice(0, bk.begin, bk.numel());
      stats_.ops++, stats_.bytes += bytes_of(in);
      if (opt_.zero_stage == 0) im.pending.push_back(comm_->all_reduce(in, comm::ReduceOp::avg));
      else im.pending.push_back(comm_->reduce_scatter(grads.slice(0, seg.offset, seg.count), in, comm::ReduceOp::avg));
    }
    return;
  }
  const int b = im.unit_bucket[unit];
  const Bucket& bk = buckets_[b];
  if (unit != bk.first_unit) return;  // the bucket's lowest unit finishes it
  const Segment& seg = segments_[b];
  OwnedTensor buf = std::move(im.open[b]);
  LOOM_CHECK(buf.defined(), "bucket ", b, " finished without gradients");
  if (comm_ == nullptr) {
    Tensor dst = Tensor(grad_shard_).slice(0, seg.shard_offset, seg.count);
    kernels::add(dst, dst, Tensor(buf).slice(0, seg.offset - bk.begin, seg.count));
    return;
  }
  // The reduced piece lands in its own buffer (not in place: the MPI backend
  // would copy the whole bucket to a scratch buffer to reduce in place).
  OwnedTensor piece = im.pools[MemTag::comm].empty(DType::f32, {seg.count});
  stats_.ops++, stats_.bytes += bytes_of(buf);
  comm::WorkPtr work = comm_->reduce_scatter(piece, buf, comm::ReduceOp::avg);
  im.reducing.push_back({std::move(buf), std::move(piece), std::move(work), b});
  // Finished reductions are added into the shard; at most two stay in flight
  // (the memory of stage 2 is the shard plus a few buckets). The rest are
  // retired by grad_norm(), so the last buckets overlap the next
  // micro-batch's forward.
  while (!im.reducing.empty() && retire_reduction(false)) {
  }
  while (im.reducing.size() > 2) retire_reduction(true);
}

bool DataParallel::retire_reduction(bool block) {
  Impl& im = *impl_;
  Impl::GradBuffer& g = im.reducing.front();
  if (!block && !g.work->test()) return false;
  if (block) {
    const auto start = Clock::now();
    g.work->wait();
    stats_.exposed_seconds += seconds_since(start);
  }
  const Segment& s = segments_[g.bucket];
  Tensor dst = Tensor(grad_shard_).slice(0, s.shard_offset, s.count);
  kernels::add(dst, dst, g.piece);
  im.reducing.pop_front();
  return true;
}

namespace {

// The sum of a per-rank value over a group, the same bits on every rank:
// exchanged as bit patterns and summed in rank order.
double exact_sum(comm::Communicator* group, double value) {
  if (group == nullptr || group->size() == 1) return value;
  int64_t mine = 0;
  std::memcpy(&mine, &value, sizeof mine);
  std::vector<int64_t> all(static_cast<size_t>(group->size()));
  group->all_gather(Tensor(all.data(), DType::i64, {group->size()}), Tensor(&mine, DType::i64, {1}))->wait();
  double sum = 0;
  for (int64_t bits : all) {
    double v = 0;
    std::memcpy(&v, &bits, sizeof v);
    sum += v;
  }
  return sum;
}

}  // namespace

void DataParallel::wait_gradients() {
  Impl& im = *impl_;
  const auto start = Clock::now();
  for (auto& w : im.pending) w->wait();
  im.pending.clear();
  stats_.exposed_seconds += seconds_since(start);
  while (!im.reducing.empty()) retire_reduction(true);
}

double DataParallel::grad_sum_squares() {
  wait_gradients();
  const int stage = opt_.zero_stage;
  // Under tensor parallelism a replicated parameter (model/params.h) has the
  // same gradient on every tp rank: only tp rank 0 counts it. A pipeline
  // stage's copy of a tied embedding is counted by stage 0.
  const bool skip_replicated = tp_ != nullptr && tp_->size() > 1 && tp_->rank() != 0;
  const std::vector<model::ParamSpec>& specs = model_.param_specs();
  const bool has_copy = std::any_of(specs.begin(), specs.end(), [](const model::ParamSpec& s) { return s.pp_copy; });
  double sum = 0;
  for (const Segment& s : segments_) {
    const Tensor g = stage < 2 ? model_.grads().slice(0, s.offset, s.count)
                               : Tensor(grad_shard_).slice(0, s.shard_offset, s.count);
    if (!skip_replicated && !has_copy) {
      sum += kernels::sum_squares(g);
      continue;
    }
    for_each_overlap(specs, s.offset, s.offset + s.count, [&](const model::ParamSpec& spec, int64_t lo, int64_t hi) {
      const bool counted = !spec.pp_copy && !(skip_replicated && spec.replicated());
      if (counted) sum += kernels::sum_squares(g.slice(0, lo - s.offset, hi - lo));
    });
  }
  // Stage 0: every rank holds the whole averaged gradient.
  if (stage > 0) sum = exact_sum(comm_, sum);
  return exact_sum(tp_, sum);
}

double DataParallel::grad_norm() { return std::sqrt(grad_sum_squares()); }

double exact_group_sum(comm::Communicator* group, double value) { return exact_sum(group, value); }

double DataParallel::mean(double value) { return exact_sum(comm_, value) / size_; }

// ---- the update ----

void DataParallel::update(double lr, float grad_scale) {
  Impl& im = *impl_;
  ++step_;
  const int stage = opt_.zero_stage;
  kernels::AdamWConfig cfg;
  cfg.lr = static_cast<float>(lr);
  cfg.beta1 = static_cast<float>(adamw_.beta1);
  cfg.beta2 = static_cast<float>(adamw_.beta2);
  cfg.eps = static_cast<float>(adamw_.eps);
  cfg.step = step_;
  cfg.grad_scale = grad_scale;
  for (const ParamPiece& p : im.pieces) {
    // Where the reduced gradient, the weights the model reads and the master live.
    Tensor grad = stage < 2 ? model_.grads().slice(0, p.offset, p.count)
                            : Tensor(grad_shard_).slice(0, p.shard_offset, p.count);
    const Tensor weights = stage < 3 ? model_.params().slice(0, p.offset, p.count)
                                     : Tensor(param_shard_).slice(0, p.shard_offset, p.count);
    if (host_grads_.defined()) {  // offload: the update reads a host copy
      Tensor host = Tensor(host_grads_).slice(0, p.shard_offset, p.count);
      std::memcpy(host.data(), grad.data(), static_cast<size_t>(bytes_of(host)));
      grad = host;
    }
    const Tensor master = master_.defined() ? Tensor(master_).slice(0, p.shard_offset, p.count) : weights;
    cfg.weight_decay = p.decay ? static_cast<float>(adamw_.weight_decay) : 0.f;
    kernels::adamw_step(master, Tensor(m_).slice(0, p.shard_offset, p.count),
                        Tensor(v_).slice(0, p.shard_offset, p.count), grad,
                        master_.defined() ? weights : Tensor(), cfg);
  }
  // Every rank updated its piece of each bucket; all_gather the rest in place.
  if (stage == 1 || stage == 2) gather_pieces(model_.params());
}

// ---- stage 3 parameters ----

Tensor DataParallel::acquire_params(int unit, model::Pass pass) {
  Impl& im = *impl_;
  LOOM_CHECK(opt_.zero_stage == 3, "acquire_params under ZeRO stage ", opt_.zero_stage);
  auto issue = [&](int u) {
    Impl::Gathered& g = im.gathered[u];
    if (g.buf.defined()) return;
    const Segment& s = segments_[im.unit_bucket[u]];
    g.buf = im.pools[MemTag::comm].empty(model_.compute_dtype(), {model_.units()[u].numel()});
    const Tensor mine = Tensor(param_shard_).slice(0, s.shard_offset, s.count);
    if (comm_ == nullptr) {
      std::memcpy(g.buf.data(), mine.data(), static_cast<size_t>(bytes_of(mine)));
    } else {
      g.work = comm_->all_gather(gather_view(g.buf), gather_view(mine));
    }
  };
  issue(unit);
  Impl::Gathered& g = im.gathered[unit];
  if (g.work) {
    const auto start = Clock::now();
    g.work->wait();
    stats_.exposed_seconds += seconds_since(start);
    g.work.reset();
  }
  ++g.refs;
  // Prefetch the unit this pass reads next.
  const auto& order = im.order[static_cast<int>(pass)];
  size_t& cursor = im.cursor[static_cast<int>(pass)];
  if (cursor >= order.size() || order[cursor] != unit) {
    const auto it = std::find(order.begin(), order.end(), unit);
    cursor = static_cast<size_t>(it - order.begin());
  }
  ++cursor;
  if (cursor < order.size()) issue(order[cursor]);
  return g.buf;
}

void DataParallel::release_params(int unit) {
  Impl::Gathered& g = impl_->gathered[unit];
  LOOM_CHECK(g.refs > 0, "release_params(", unit, ") without acquire");
  if (--g.refs == 0) g.buf = OwnedTensor();
}

// ---- checkpoints and export ----

void DataParallel::pack_master(Tensor out) const {
  LOOM_CHECK(out.dtype() == DType::f32 && out.numel() == shard_numel_, "pack_master: ", out.str());
  for (const Segment& s : segments_) {
    Tensor dst = out.slice(0, s.shard_offset, s.count);
    if (master_.defined()) kernels::cast(dst, Tensor(master_).slice(0, s.shard_offset, s.count));
    else if (param_shard_.defined()) kernels::cast(dst, Tensor(param_shard_).slice(0, s.shard_offset, s.count));
    else kernels::cast(dst, model_.params().slice(0, s.offset, s.count));
  }
}

void DataParallel::load_state(const Tensor& master, const Tensor& m, const Tensor& v) {
  for (const Tensor* t : {&master, &m, &v})
    LOOM_CHECK(t->dtype() == DType::f32 && t->numel() == shard_numel_, "load_state: ", t->str());
  kernels::cast(m_, m);
  kernels::cast(v_, v);
  for (const Segment& s : segments_) {
    const Tensor src = master.slice(0, s.shard_offset, s.count);
    if (master_.defined()) kernels::cast(Tensor(master_).slice(0, s.shard_offset, s.count), src);
    if (param_shard_.defined()) kernels::cast(Tensor(param_shard_).slice(0, s.shard_offset, s.count), src);
    else kernels::cast(model_.params().slice(0, s.offset, s.count), src);
  }
  if (opt_.zero_stage == 1 || opt_.zero_stage == 2) gather_pieces(model_.params());
}

void DataParallel::gather_master(Tensor out) {
  LOOM_CHECK(out.dtype() == DType::f32 && out.numel() == model_.num_params(), "gather_master: ", out.str());
  OwnedTensor packed = impl_->pools[MemTag::workspace].empty(DType::f32, {shard_numel_});
  pack_master(packed);
  for (const Segment& s : segments_)
    std::memcpy(out.slice(0, s.offset, s.count).data(), Tensor(packed).slice(0, s.shard_offset, s.count).data(),
                static_cast<size_t>(s.count) * 4);
  if (opt_.zero_stage > 0) gather_pieces(out);
}

void DataParallel::gather_pieces(Tensor flat) {
  if (comm_ == nullptr) return;
  std::vector<comm::WorkPtr> works;
  for (size_t b = 0; b < buckets_.size(); ++b)
    works.push_back(comm_->all_gather(gather_view(flat.slice(0, buckets_[b].begin, buckets_[b].numel())),
                                      gather_view(flat.slice(0, segments_[b].offset, segments_[b].count))));
  for (auto& w : works) w->wait();
}

double DataParallel::measure_gradient_comm_seconds(int repeats) {
  if (comm_ == nullptr) return 0;
  double best = 1e30;
  OwnedTensor scratch;
  int64_t largest = 0;
  for (const Bucket& b : buckets_) largest = std::max(largest, b.numel());
  scratch = impl_->pools[MemTag::comm].zeros(DType::f32, {largest});
  for (int r = 0; r < std::max(1, repeats); ++r) {
    comm_->barrier()->wait();
    const auto start = Clock::now();
    std::vector<comm::WorkPtr> works;
    for (size_t b = buckets_.size(); b-- > 0;) {
      const Tensor in = Tensor(scratch).slice(0, 0, buckets_[b].numel());
      const Segment& s = segments_[b];
      if (opt_.zero_stage == 0) works.push_back(comm_->all_reduce(in, comm::ReduceOp::avg));
      else works.push_back(comm_->reduce_scatter(in.slice(0, s.offset - buckets_[b].begin, s.count), in,
                                                 comm::ReduceOp::avg));
      // Buckets share the scratch buffer: one at a time.
      works.back()->wait();
    }
    best = std::min(best, seconds_since(start));
  }
  return best;
}

}  // namespace loom::parallel
