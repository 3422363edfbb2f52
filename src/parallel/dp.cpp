#include "parallel/dp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/host_values.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "parallel/dp_state.h"

namespace loom::parallel {

// ---- group index <-> flat buffer ----

int64_t flat_index(const GroupSpace& s, int64_t index) {
  int64_t flat = -1;
  for_each_flat_run(s, index, 1, [&](int64_t f, int64_t, int64_t) { flat = f; });
  LOOM_CHECK(flat >= 0, "group index ", index, " is in no run");
  return flat;
}

void pack_runs(const GroupSpace& s, const Tensor& flat, int64_t index, Tensor packed) {
  for_each_flat_run(s, index, packed.numel(), [&](int64_t f, int64_t at, int64_t n) {
    kernels::copy(packed.slice(0, at, n), flat.slice(0, f, n));
  });
}

void unpack_runs(const GroupSpace& s, const Tensor& packed, int64_t index, Tensor flat) {
  for_each_flat_run(s, index, packed.numel(), [&](int64_t f, int64_t at, int64_t n) {
    kernels::copy(flat.slice(0, f, n), packed.slice(0, at, n));
  });
}

// ---- construction ----

namespace {

std::vector<ParamGroup> groups_of(const DpOptions& o, comm::Communicator& dp) {
  if (!o.groups.empty()) return o.groups;
  return {ParamGroup{kDenseGroup, dp, all_params()}};
}

// Group g's layout on this rank: its space, buckets (with the solo
// parameters it holds cut out), this rank's segments and their pieces.
GroupState make_group(const ParamGroup& pg, const model::Model& model, const std::vector<int>& group_of, int g,
                      const DpOptions& o) {
  GroupSpace space = group_space(model.param_specs(), model.units(), group_of, g);
  const std::vector<model::Unit> solo = solo_ranges(space, o.solo_params);
  comm::Communicator& comm = pg.comm;
  GroupState s(GroupLayout{pg.name, pg.comm, pg.spread, std::move(space), {}, {}, {}, 0});
  GroupLayout& l = s.layout;
  l.buckets = make_buckets(l.space.units, o.zero_stage, o.bucket_mb, solo);
  l.segments = shard_segments(l.buckets, o.zero_stage, comm.size(), comm.rank());
  l.pieces = group_pieces(l.segments, l.space);
  for (const Segment& seg : l.segments) l.shard_numel += seg.count;
  s.finishes.resize(model.units().size());
  for (int b = 0; b < static_cast<int>(l.buckets.size()); ++b) s.finishes[l.buckets[b].first_unit].push_back(b);
  s.open.resize(l.buckets.size());
  return s;
}

// The f32 arrays a record of the offload file holds: the master weights
// when kept apart from the parameters, then the optimizer's.
int disk_arrays(DType compute, const DpOptions& o) {
  return (compute != DType::f32 ? 1 : 0) + o.optimizer_state_floats;
}

// The shard state every group needs under o (see dp.h), checked first
// against memory beside what the pools hold already (the model) and the
// model's bookkeeping: a run too large is refused with a message instead of
// killed by the OS. Returns whether DataParallel keeps master weights.
bool allocate_shard_state(std::vector<GroupState>& groups, const model::Model& model, const DpOptions& o,
                          Pools& pools, Pools& state) {
  const int stage = o.zero_stage;
  const DType compute = model.compute_dtype();
  int64_t S = 0;
  for (const GroupState& g : groups) S += g.layout.shard_numel;
  const DataParallel::ShardStateBytes bytes = DataParallel::shard_state_bytes(S, compute, o);
  const bool master = compute != DType::f32 || o.offload_optimizer;  // kept apart (on disk under o.disk)
  std::string parts = o.optimizer_state_floats > 0 ? "optimizer state" : "";
  for (const auto& [has, part] : {std::pair{master, "master weights"}, std::pair{stage >= 2, "gradient shard"},
                                  std::pair{stage == 3, "parameter shard"}})
    if (has) parts += (parts.empty() ? "" : ", ") + std::string(part);
  model::require_fits_memory(pools, static_cast<double>(bytes.total()) + static_cast<double>(model.memory().host),
                             concat("the training state of ", S, " parameters on this rank (", parts,
                                    ") and the model's bookkeeping"),
                             "lower model.n_layer or model.n_embd, or shard it over more ranks (parallel.zero_stage "
                             ">= 1 with parallel.dp > 1, parallel.tp, parallel.pp)");
  for (GroupState& g : groups) {
    const int64_t n = g.layout.shard_numel;
    if (master && !o.disk.enabled) g.master = state[MemTag::master].zeros(DType::f32, {n});
    if (o.disk.params) continue;  // on disk: the slots of OffloadedShards instead
    if (stage >= 2) g.grad_shard = pools[MemTag::grads].zeros(DType::f32, {n});
    if (stage == 3) g.param_shard = pools[MemTag::params].zeros(compute, {n});
    if (o.offload_optimizer) g.host_grads = state[MemTag::optimizer].zeros(DType::f32, {n});
  }
  return master;
}

}  // namespace

DataParallel::ShardStateBytes DataParallel::shard_state_bytes(int64_t S, DType compute, const DpOptions& o) {
  const bool master = compute != DType::f32 || o.offload_optimizer;
  ShardStateBytes b{.params = o.zero_stage == 3 ? static_cast<int64_t>(dtype_size(compute)) * S : 0,
                    .grads = o.zero_stage >= 2 ? 4 * S : 0,
                    .master = master ? 4 * S : 0,
                    .optimizer = 4 * S * (o.optimizer_state_floats + (o.offload_optimizer ? 1 : 0))};
  if (o.disk.enabled) {  // master and optimizer state on disk: in memory, the stream's buffers
    b.master = 0;
    b.optimizer = OffloadedState::buffer_bytes(S, o.disk.budget_bytes, disk_arrays(compute, o));
  }
  if (o.disk.enabled && o.disk.params) {  // the shards on disk: in memory, their slots
    const int arrays = disk_arrays(compute, o);
    b.params = OffloadedShards::buffer_bytes(OffloadedShards::kParams, S, o.disk.budget_bytes, arrays,
                                             static_cast<int64_t>(dtype_size(compute)), o.disk);
    b.grads = OffloadedShards::buffer_bytes(OffloadedShards::kGrads, S, o.disk.budget_bytes, arrays, 4, o.disk);
  }
  return b;
}

model::Storage DataParallel::model_storage(int zero_stage) {
  model::Storage s;
  s.master = false;
  s.grads = zero_stage < 2;
  s.params = zero_stage < 3;
  return s;
}

DataParallel::DataParallel(model::Model& model, comm::Communicator& dp, comm::Communicator& tp,
                           const DpOptions& options, Pools& pools)
    : opt_(options), model_(model), dp_(dp), tp_(tp), impl_(std::make_unique<Impl>(pools)) {
  const int stage = opt_.zero_stage;
  const model::Storage want = model_storage(stage), has = model.storage();
  LOOM_REQUIRE(has.params == want.params && has.grads == want.grads && has.master == want.master,
               "DataParallel: the model was not built with DataParallel::model_storage(", stage, ")");
  const std::vector<model::ParamSpec>& specs = model.param_specs();
  for (const std::string& name : opt_.solo_params)
    LOOM_REQUIRE(std::any_of(specs.begin(), specs.end(), [&](const model::ParamSpec& p) { return p.name == name; }),
                 "DataParallel: solo parameter '", name, "' is not a parameter of the model");
  const std::vector<ParamGroup> groups = groups_of(opt_, dp);
  const std::vector<int> group_of = assign_param_groups(specs, groups);
  require_whole_units(specs, model.units(), group_of, groups, stage);
  Impl& im = *impl_;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g)
    im.groups.push_back(make_group(groups[g], model, group_of, g, opt_));
  const size_t U = model.units().size();
  im.unit_group.assign(U, 0);
  im.unit_bucket.assign(U, 0);
  for (int g = 0; g < static_cast<int>(im.groups.size()); ++g) {
    const GroupLayout& l = im.groups[g].layout;
    for (int b = 0; b < static_cast<int>(l.buckets.size()); ++b)
      for (int u = l.buckets[b].first_unit; u <= l.buckets[b].last_unit; ++u)
        if (l.space.units[u].numel() > 0) im.unit_group[u] = g, im.unit_bucket[u] = b;
  }
  im.gathered.resize(U);
  im.has_pp_copy = std::any_of(specs.begin(), specs.end(), [](const model::ParamSpec& s) { return s.pp_copy; });
  set_acquire_order(model, im.order);
  LOOM_REQUIRE(!opt_.disk.params || (opt_.disk.enabled && stage == 3),
               "DataParallel: the parameter and gradient shards go to disk under ZeRO stage 3 only (this is stage ",
               stage, ")");
  LOOM_REQUIRE(opt_.host_state == nullptr || (opt_.offload_optimizer && opt_.host_state->device().is_cpu()),
               "DataParallel: DpOptions::host_state is the host's pools of an offloaded optimizer (offload_optimizer)");
  im.has_master = allocate_shard_state(im.groups, model, opt_, pools, state_pools());
  if (opt_.disk.enabled) {
    LOOM_REQUIRE(!opt_.offload_optimizer && opt_.optimizer_state_floats > 0 && opt_.exchange == nullptr,
                 "DataParallel: an optimizer offloaded to disk keeps its state here (not with offload_optimizer, ",
                 "nor with a parameter server's optimizer)");
    std::vector<std::vector<ParamPiece>> pieces;
    for (const GroupState& gs : im.groups) pieces.push_back(gs.layout.pieces);
    im.disk = std::make_unique<OffloadedState>(pieces, disk_arrays(model.compute_dtype(), opt_), opt_.disk,
                                               pools[MemTag::optimizer]);
  }
  if (opt_.disk.params) {
    im.shards = std::make_unique<OffloadedShards>(*im.disk, model.compute_dtype(), opt_.disk, pools[MemTag::params],
                                                  pools[MemTag::grads]);
    im.written.assign(im.disk->extents().size(), 0);
    im.terms.resize(im.disk->extents().size());
  }
  model.set_hooks(this);
  if (opt_.exchange) set_exchange(opt_.exchange);
}

DataParallel::~DataParallel() {
  model_.set_hooks(nullptr);
  // Outstanding collectives read buffers freed below: finish them first.
  try {
    for (auto& p : impl_->pending) p.work->wait();
    for (auto& g : impl_->reducing) g.work->wait();
    for (auto& g : impl_->gathered) {
      if (g.work) g.work->wait();
      for (const auto& r : g.reads) r.wait();
    }
  } catch (...) {
  }
}

int DataParallel::num_groups() const { return static_cast<int>(impl_->groups.size()); }

Pools& DataParallel::state_pools() const { return opt_.host_state ? *opt_.host_state : impl_->pools; }

const GroupLayout& DataParallel::group(int g) const {
  LOOM_CHECK(g >= 0 && g < num_groups(), "parameter group ", g, " of ", num_groups());
  return impl_->groups[static_cast<size_t>(g)].layout;
}

const GroupLayout& DataParallel::only_group() const {
  if (num_groups() != 1) {
    std::string names;
    for (const GroupState& g : impl_->groups) names += (names.empty() ? "'" : ", '") + g.layout.name + "'";
    fail("DataParallel: buckets, segments, shard_numel and the single-tensor pack_master / load_master are views of "
         "one parameter group, but this model's parameters are in ", num_groups(), " (", names, ")");
  }
  return impl_->groups[0].layout;
}

Segment DataParallel::solo_piece(const std::string& name) const {
  LOOM_REQUIRE(std::find(opt_.solo_params.begin(), opt_.solo_params.end(), name) != opt_.solo_params.end(),
               "DataParallel: '", name, "' has no bucket of its own (DpOptions::solo_params)");
  for (int g = 0; g < num_groups(); ++g) {
    const GroupLayout& l = group(g);
    const auto spec = std::find_if(l.space.specs.begin(), l.space.specs.end(),
                                   [&](const model::ParamSpec& p) { return p.name == name; });
    if (spec == l.space.specs.end()) continue;
    for (size_t b = 0; b < l.buckets.size(); ++b) {
      if (l.buckets[b].begin != spec->offset) continue;
      const Segment& s = l.segments[b];
      const size_t i = static_cast<size_t>(spec - l.space.specs.begin());
      return {l.space.flat[i] + (s.offset - spec->offset), s.count, s.shard_offset};
    }
    LOOM_CHECK(false, "solo parameter ", name, " starts no bucket");
  }
  fail("DataParallel: solo parameter '", name, "' is in no parameter group");
}

void DataParallel::init_params(uint64_t seed) {
  set_params([seed](Tensor dst, const model::ParamSpec& spec) { model::init_param(dst, spec, seed); });
}

void DataParallel::set_params(const std::function<void(Tensor dst, const model::ParamSpec& spec)>& fill) {
  // One bucket at a time (buckets hold whole parameters): the temporary is
  // the largest bucket, not the whole model, so ZeRO-3 never materialises it.
  const bool on_device = !impl_->pools.device().is_cpu();
  MemoryTracker host_tracker;
  Pool host_workspace(MemTag::workspace, Device::cpu(), host_tracker);
  Pool& host_pool = on_device ? host_workspace : impl_->pools[MemTag::workspace];
  for (GroupState& gs : impl_->groups) {
    const GroupLayout& l = gs.layout;
    for (size_t b = 0; b < l.buckets.size(); ++b) {
      const Bucket& bk = l.buckets[b];
      // Drawn on the host (init_param's Philox streams), then moved to the
      // run's device where that is not the host.
      OwnedTensor host = host_pool.empty(DType::f32, {bk.numel()});
      for_each_overlap(l.space.specs, bk.begin, bk.end, [&](const model::ParamSpec& spec, int64_t, int64_t) {
        if (spec.offset < bk.begin) return;  // an earlier bucket's
        fill(Tensor(host).slice(0, spec.offset - bk.begin, spec.numel()).reshape(spec.shape), spec);
      });
      OwnedTensor staged;
      if (on_device) {
        staged = impl_->pools[MemTag::workspace].empty(DType::f32, {bk.numel()});
        copy_tensor(staged, host);
      }
      const Tensor full = on_device ? Tensor(staged) : Tensor(host);
      if (opt_.zero_stage < 3)  // every rank
        for_each_flat_run(l.space, bk.begin, bk.numel(), [&](int64_t flat, int64_t at, int64_t n) {
          kernels::cast(model_.params().slice(0, flat, n), Tensor(full).slice(0, at, n));
        });
      const Segment& s = l.segments[b];
      const Tensor src = Tensor(full).slice(0, s.offset - bk.begin, s.count);
      if (impl_->has_master) set_master(gs, s, src);
      if (opt_.zero_stage == 3) write_param_shard(gs, static_cast<int>(b), src);
    }
  }
}


void DataParallel::zero_grads() {
  if (opt_.zero_stage < 2) return model_.zero_grads();
  for (GroupState& gs : impl_->groups) {
    if (!impl_->shards) {
      kernels::fill(gs.grad_shard, 0.f);
      continue;
    }
  }
  if (impl_->shards) {  // the gradient records are overwritten, not added to
    std::fill(impl_->written.begin(), impl_->written.end(), 0);
    for (std::vector<double>& t : impl_->terms) t.clear();
  }
}

void DataParallel::begin_micro_batch(bool last) { impl_->communicate = last; }

// ---- the gradient norm ----

namespace {

// The sum of a per-rank value over a group, the same bits on every rank:
// exchanged as bit patterns and summed in rank order.
double exact_sum(comm::Communicator& group, double value) {
  if (group.size() == 1) return value;
  int64_t mine = 0;
  std::memcpy(&mine, &value, sizeof mine);
  std::vector<int64_t> all(static_cast<size_t>(group.size()));
  comm::all_gather_host(group, Tensor(all.data(), DType::i64, {group.size()}), Tensor(&mine, DType::i64, {1}));
  double sum = 0;
  for (int64_t bits : all) {
    double v = 0;
    std::memcpy(&v, &bits, sizeof v);
    sum += v;
  }
  return sum;
}

}  // namespace

bool DataParallel::counts_in_norm(int64_t flat) const {
  // Under tensor parallelism a replicated parameter (model/params.h) has the
  // same gradient on every tp rank: only tp rank 0 counts it. A pipeline
  // stage's copy of a tied embedding is counted by stage 0.
  const bool skip_replicated = tp_.size() > 1 && tp_.rank() != 0;
  if (!skip_replicated && !impl_->has_pp_copy) return true;
  bool counted = true;
  for_each_overlap(model_.param_specs(), flat, flat + 1, [&](const model::ParamSpec& spec, int64_t, int64_t) {
    counted = !spec.pp_copy && !(skip_replicated && spec.replicated());
  });
  return counted;
}

double DataParallel::shard_sum_squares(int g) const {
  const GroupState& gs = impl_->groups[static_cast<size_t>(g)];
  double sum = 0;
  if (impl_->shards) {  // each extent's blocks, taken as its gradient was written
    const auto [first, end] = impl_->disk->extents_of(g, 0, gs.layout.shard_numel);
    for (int64_t i = first; i < end; ++i)
      for (double t : impl_->terms[static_cast<size_t>(i)]) sum += t;
    return sum;
  }
  std::vector<Tensor> grads;
  for (const ParamPiece& p : gs.layout.pieces) {
    if (!counts_in_norm(p.offset)) continue;
    grads.push_back(opt_.zero_stage < 2 ? model_.grads().slice(0, p.offset, p.count)
                                        : Tensor(gs.grad_shard).slice(0, p.shard_offset, p.count));
  }
  for (const double t : norm_block_sums(grads)) sum += t;
  return sum;
}

double DataParallel::grad_sum_squares() {
  wait_gradients();
  double sum = 0;
  for (int g = 0; g < num_groups(); ++g) {
    double group_sum = shard_sum_squares(g);
    // Stage 0: every rank of the group holds the whole averaged gradient.
    const GroupLayout& l = impl_->groups[static_cast<size_t>(g)].layout;
    if (opt_.zero_stage > 0) group_sum = exact_sum(l.comm, group_sum);
    if (l.spread) group_sum = exact_sum(*l.spread, group_sum);  // the other ranks' experts
    sum += group_sum;
  }
  return exact_sum(tp_, sum);
}

void DataParallel::set_exchange(GradientExchange* exchange) {
  LOOM_REQUIRE(exchange == nullptr || (opt_.zero_stage == 0 && impl_->groups.size() == 1),
               "DataParallel: a gradient exchange (parameter server) takes stage 0's buckets of one group; this is ",
               "stage ", opt_.zero_stage, " with ", impl_->groups.size(), " groups");
  opt_.exchange = exchange;
}

double DataParallel::grad_norm() { return std::sqrt(grad_sum_squares()); }

double exact_group_sum(comm::Communicator& group, double value) { return exact_sum(group, value); }

double DataParallel::mean(double value) { return exact_sum(dp_, value) / dp_.size(); }

// ---- the update ----

void DataParallel::update_finish() {
  // Every rank updated its piece of each bucket; all_gather the rest in place.
  if (opt_.zero_stage == 1 || opt_.zero_stage == 2) gather_pieces(model_.params());
}

double DataParallel::measure_gradient_comm_seconds(int repeats) {
  int64_t largest = 0;
  for (const GroupState& gs : impl_->groups)
    if (gs.layout.comm.get().size() > 1)
      for (const Bucket& b : gs.layout.buckets) largest = std::max(largest, b.numel());
  if (largest == 0) return 0;
  double best = 1e30;
  OwnedTensor scratch = impl_->pools[MemTag::comm].zeros(DType::f32, {largest});
  for (int r = 0; r < std::max(1, repeats); ++r) {
    for (const GroupState& gs : impl_->groups)
      if (gs.layout.comm.get().size() > 1) gs.layout.comm.get().barrier()->wait();
    const auto start = DpClock::now();
    for (const GroupState& gs : impl_->groups) {
      const GroupLayout& l = gs.layout;
      comm::Communicator& comm = l.comm;
      if (comm.size() == 1) continue;
      for (size_t b = l.buckets.size(); b-- > 0;) {
        const Tensor in = Tensor(scratch).slice(0, 0, l.buckets[b].numel());
        const Segment& s = l.segments[b];
        // Buckets share the scratch buffer: one at a time.
        if (opt_.zero_stage == 0) comm.all_reduce(in, comm::ReduceOp::avg)->wait();
        else comm.reduce_scatter(in.slice(0, s.offset - l.buckets[b].begin, s.count), in, comm::ReduceOp::avg)->wait();
      }
    }
    best = std::min(best, seconds_since(start));
  }
  return best;
}

}  // namespace loom::parallel
