// The NCCL backend (comm/nccl/nccl_backend.h) at every world size that
// tests/mpi.cmake runs: every op against a direct computation on the host,
// as in mpi_test_comm.cpp. Needs one CUDA device per rank; elsewhere each
// test is skipped with the reason (no device, or fewer devices than ranks).
// Built against loom_comm_nccl where it exists (LOOM_HAVE_NCCL); without it
// the suite is one skipped test saying so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/count_mismatch.h"
#include "comm/rank_values.h"
#include "common/mpi_env.h"
#include "common/tensors.h"
#include "core/error.h"

#if LOOM_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "comm/nccl/nccl_backend.h"
#endif

namespace loom::comm {
namespace {

using test::world;
using namespace test_values;

#if !LOOM_HAVE_NCCL

TEST(Nccl, SkippedWithoutTheNcclBackend) {
  GTEST_SKIP() << "the NCCL backend is not built (no CUDA toolkit / NCCL found) or not linked";
}

#else

// Why the device tests cannot run on this machine, or "" when they can.
const std::string& skip_reason() {
  static const std::string reason = [] {
    std::string why;
    const int n = cuda_device_count(&why);
    if (n == 0) return "no CUDA device: " + why;
    if (n < world().size() && !nccl_shares_gpus())
      return concat("needs one CUDA device per rank: ", world().size(), " ranks, ", n,
                    " devices (LOOM_NCCL_SHARE_GPU=1 lets ranks share one)");
    return std::string();
  }();
  return reason;
}

// The NCCL world, made on first use (collective: every rank runs the same
// tests in the same order).
Communicator& nccl() {
  static std::unique_ptr<Communicator> c = nccl_world(world(), world().rank() % cuda_device_count());
  return *c;
}

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!skip_reason().empty()) GTEST_SKIP() << skip_reason();
  }
};

// A device buffer of n elements of T; a Tensor on the communicator's device.
template <typename T>
class DeviceVec {
 public:
  explicit DeviceVec(const std::vector<T>& host) : n_(static_cast<int64_t>(host.size())) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes(), 1)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceVec(int64_t n) : DeviceVec(std::vector<T>(n)) {}
  ~DeviceVec() { cudaFree(ptr_); }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;

  Tensor tensor() const { return Tensor(ptr_, dtype_of<T>::value, {n_}, nccl().device()); }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  size_t bytes() const { return static_cast<size_t>(n_) * sizeof(T); }
  void* ptr_ = nullptr;
  int64_t n_;
};

template <typename T>
double reduced(int size, int64_t i, ReduceOp op) {
  double acc = value<T>(0, i);
  for (int r = 1; r < size; ++r) acc = op == ReduceOp::max ? std::max(acc, value<T>(r, i)) : acc + value<T>(r, i);
  return op == ReduceOp::avg ? acc / size : acc;
}

// Sums and maxima of these values are exact. avg divides on the device in
// f32 (bf16 too: nccl_backend.h), and bf16 then rounds once: within half a
// bf16 ulp (at most |expect| 2^-8) of the exact mean, plus f32 slack.
template <typename T>
double tolerance(ReduceOp op, double expect) {
  if (op != ReduceOp::avg) return 0;
  return std::is_same_v<T, bf16> ? std::abs(expect) / 256 + 1e-5 : 1e-6;
}

std::vector<int64_t> counts(int size) { return {0, 1, size - 1, size + 1, 4 * size, 4099}; }

template <typename T>
void check_all_reduce(int64_t n, ReduceOp op) {
  Communicator& c = nccl();
  DeviceVec<T> buf(filled<T>(c.rank(), n));
  c.all_reduce(buf.tensor(), op)->wait();
  const std::vector<T> got = buf.host();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(load(got[i]), reduced<T>(c.size(), i, op), tolerance<T>(op, reduced<T>(c.size(), i, op)))
        << dtype_name(dtype_of<T>::value) << " " << reduce_op_name(op) << " n " << n << " i " << i;
}

template <typename T>
void check_reduce_scatter(int64_t n, ReduceOp op) {
  Communicator& c = nccl();
  const Range own = shard_range(n, c.size(), c.rank());
  DeviceVec<T> in(filled<T>(c.rank(), n)), out(own.count);
  c.reduce_scatter(out.tensor(), in.tensor(), op)->wait();
  const std::vector<T> got = out.host();
  for (int64_t i = 0; i < own.count; ++i)
    ASSERT_NEAR(load(got[i]), reduced<T>(c.size(), own.offset + i, op),
                tolerance<T>(op, reduced<T>(c.size(), own.offset + i, op)))
        << dtype_name(dtype_of<T>::value) << " " << reduce_op_name(op) << " n " << n << " i " << i;
}

template <typename T>
void check_all_gather(int64_t n) {
  Communicator& c = nccl();
  const Range own = shard_range(n, c.size(), c.rank());
  DeviceVec<T> in(filled<T>(c.rank(), own.count, own.offset)), out(n);
  c.all_gather(out.tensor(), in.tensor())->wait();
  const std::vector<T> got = out.host();
  for (int r = 0; r < c.size(); ++r) {
    const Range rr = shard_range(n, c.size(), r);
    for (int64_t i = rr.offset; i < rr.offset + rr.count; ++i)
      ASSERT_EQ(load(got[i]), value<T>(r, i)) << "n " << n << " i " << i;
  }
}

TEST_F(Nccl, AllReduceMatchesDirectComputationForEveryDtypeOpAndCount) {
  for (int64_t n : counts(nccl().size())) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      check_all_reduce<float>(n, op);
      check_all_reduce<bf16>(n, op);
    }
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      check_all_reduce<int32_t>(n, op);
      check_all_reduce<int64_t>(n, op);
    }
  }
}

TEST_F(Nccl, ReduceScatterGivesEachRankItsShardOfTheReductionForAnyCount) {
  for (int64_t n : counts(nccl().size())) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
      check_reduce_scatter<float>(n, op);
      check_reduce_scatter<bf16>(n, op);
    }
    check_reduce_scatter<int64_t>(n, ReduceOp::sum);
  }
}

// Inputs on which accumulating in bf16 and in f32 disagree whatever the
// reduction order. Element i: rank i % size holds 1, the next rank 2^-9, the
// one after 2^-9 + 2^-16 (all exact in bf16), every other rank 0; negated for
// odd i. With a rounding to bf16 (8 significant bits) after each addition
// every order gives 1: 1 + 2^-9 and 1 + (2^-9 + 2^-16) round to 1, and
// 2^-9 + (2^-9 + 2^-16) = 2^-8 + 2^-16 ties to the even 2^-8, then 1 + 2^-8
// ties to the even 1. In f32 every partial sum is exact, so the sum is
// 1 + 2^-8 + 2^-16, rounded once to 1 + 2^-7.
bf16 probe_value(int rank, int size, int64_t i) {
  const int64_t role = (rank - i % size + size) % size;
  const float tiny = std::ldexp(1.0f, -9);
  const float v = role == 0 ? 1.0f : role == 1 ? tiny : role == 2 ? tiny + std::ldexp(1.0f, -16) : 0.0f;
  return to_bf16(i % 2 ? -v : v);
}

std::vector<bf16> probe_values(int rank, int size, int64_t n, int64_t begin = 0) {
  std::vector<bf16> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = probe_value(rank, size, begin + i);
  return v;
}

// The contract's result: the f32 sum (exact here: any order), divided by size
// for avg, rounded to bf16 once (core/dtype.h's to_bf16, nearest even).
bf16 f32_reduced(int size, int64_t i, ReduceOp op) {
  float acc = 0;
  for (int r = 0; r < size; ++r) acc += from_bf16(probe_value(r, size, i));
  return to_bf16(op == ReduceOp::avg ? acc / static_cast<float>(size) : acc);
}

// The claim the probe rests on, checked on the host: each of the three
// orders of its nonzero values, rounded to bf16 after each addition (the f32
// sum of two of them is exact, so to_bf16 of it is the bf16 addition),
// differs from the f32-accumulated result.
void expect_probe_separates_bf16_from_f32(int size) {
  for (int64_t i : {int64_t{0}, int64_t{1}}) {
    std::vector<float> x;
    for (int r = 0; r < size; ++r) {
      const bf16 v = probe_value(r, size, i);
      if (from_bf16(v) != 0) x.push_back(from_bf16(v));
    }
    ASSERT_EQ(x.size(), 3u);
    auto add = [](float a, float b) { return from_bf16(to_bf16(a + b)); };
    const float f32_sum = from_bf16(f32_reduced(size, i, ReduceOp::sum));
    EXPECT_NE(add(add(x[0], x[1]), x[2]), f32_sum) << "i " << i;
    EXPECT_NE(add(add(x[0], x[2]), x[1]), f32_sum) << "i " << i;
    EXPECT_NE(add(add(x[1], x[2]), x[0]), f32_sum) << "i " << i;
    EXPECT_EQ(f32_sum, i % 2 ? -(1 + std::ldexp(1.0f, -7)) : 1 + std::ldexp(1.0f, -7));
  }
}

void expect_bitwise(const std::vector<bf16>& got, int64_t begin, ReduceOp op, const std::string& what) {
  const int size = nccl().size();
  for (size_t k = 0; k < got.size(); ++k) {
    const int64_t i = begin + static_cast<int64_t>(k);
    const bf16 expect = f32_reduced(size, i, op);
    ASSERT_EQ(got[k].bits, expect.bits) << what << " " << reduce_op_name(op) << " i " << i << ": got "
                                        << from_bf16(got[k]) << ", f32-accumulated " << from_bf16(expect);
  }
}

// Sums at 3+ ranks; averages too when size is a power of two, where the f32
// division is exact whichever way NCCL does it. Counts: one and several
// blocks, past the conversion kernels' grid cap (8192 x 256 elements), and
// reduce_scatter's divisible and uneven paths.
TEST_F(Nccl, Bf16SumAndAvgAccumulateInF32AndRoundOnceWhateverTheOrder) {
  Communicator& c = nccl();
  const int size = c.size();
  if (size < 3) GTEST_SKIP() << "needs 3 or more ranks for three nonzero values, have " << size;
  expect_probe_separates_bf16_from_f32(size);
  std::vector<ReduceOp> ops = {ReduceOp::sum};
  if ((size & (size - 1)) == 0) ops.push_back(ReduceOp::avg);
  const int64_t big = (int64_t{1} << 21) + 7;
  for (ReduceOp op : ops) {
    for (int64_t n : {int64_t{1}, int64_t{4099}, big}) {
      DeviceVec<bf16> buf(probe_values(c.rank(), size, n));
      c.all_reduce(buf.tensor(), op)->wait();
      expect_bitwise(buf.host(), 0, op, concat("all_reduce n ", n));
    }
    for (int64_t n : {int64_t{4} * size, int64_t{4} * size + 1, big}) {
      const Range own = shard_range(n, size, c.rank());
      DeviceVec<bf16> in(probe_values(c.rank(), size, n)), out(own.count);
      c.reduce_scatter(out.tensor(), in.tensor(), op)->wait();
      expect_bitwise(out.host(), own.offset, op, concat("reduce_scatter n ", n));
    }
  }
}

TEST_F(Nccl, AllGatherPlacesEveryRanksShardForAnyCount) {
  for (int64_t n : counts(nccl().size())) {
    check_all_gather<float>(n);
    check_all_gather<bf16>(n);
    check_all_gather<int32_t>(n);
  }
}

TEST_F(Nccl, BroadcastFromEveryRootReachesEveryRank) {
  Communicator& c = nccl();
  for (int root = 0; root < c.size(); ++root) {
    DeviceVec<float> buf(filled<float>(c.rank(), 1001));
    c.broadcast(buf.tensor(), root)->wait();
    EXPECT_EQ(buf.host(), filled<float>(root, 1001)) << "root " << root;
  }
}

// Each rank posts a send to both neighbours before its receives, the
// pipeline's exchange: the two directions must not wait for each other.
TEST_F(Nccl, SendAndRecvWithBothNeighboursDoNotDeadlock) {
  Communicator& c = nccl();
  if (c.size() == 1) {
    DeviceVec<float> buf(4);
    test::expect_error([&] { c.send(buf.tensor(), 0); }, {"cannot send to itself"});
    return;
  }
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() + c.size() - 1) % c.size();
  DeviceVec<int32_t> to_next(filled<int32_t>(c.rank(), 513)), to_prev(filled<int32_t>(c.rank(), 513, 7));
  DeviceVec<int32_t> from_prev(513), from_next(513);
  std::vector<WorkPtr> works = {c.send(to_next.tensor(), next), c.send(to_prev.tensor(), prev)};
  works.push_back(c.recv(from_prev.tensor(), prev));
  works.push_back(c.recv(from_next.tensor(), next));
  for (const WorkPtr& w : works) w->wait();
  EXPECT_EQ(from_prev.host(), filled<int32_t>(prev, 513));
  EXPECT_EQ(from_next.host(), filled<int32_t>(next, 513, 7));
}

// Messages between neighbours queue per pair and direction (p2p_links.h):
// ranks 1 .. n-2 post a receive from the previous rank, then a send to the
// next; rank n-1 sends to rank 0 only once its own receive is here, and rank
// 0 to rank 1 only once that message is. Were the send queued behind the
// receive on one stream, no rank could move.
TEST_F(Nccl, NeighbourMessagesQueuePerPairSoAWaveAroundTheRingCompletes) {
  Communicator& c = nccl();
  const int n = c.size(), r = c.rank();
  if (n < 3) GTEST_SKIP() << "a ring of 3 ranks or more; have " << n;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  DeviceVec<int32_t> out(filled<int32_t>(r, 4099)), in(4099);
  if (r == 0 || r == n - 1) {
    c.recv(in.tensor(), prev)->wait();
    c.send(out.tensor(), next)->wait();
  } else {
    WorkPtr got = c.recv(in.tensor(), prev), sent = c.send(out.tensor(), next);
    got->wait(), sent->wait();
  }
  EXPECT_EQ(in.host(), filled<int32_t>(prev, 4099));
}

// Block j of rank r's input holds value(r, 1000 j + k); rank i receives it
// as block r of its output.
TEST_F(Nccl, AllToAllAndAllToAllVDeliverEveryBlock) {
  Communicator& c = nccl();
  const int size = c.size(), me = c.rank();
  std::vector<int64_t> in_counts(size), out_counts(size);
  for (int j = 0; j < size; ++j) {
    in_counts[j] = (me + j) % 3 + 1;   // to j
    out_counts[j] = (j + me) % 3 + 1;  // from j: j's in_counts[me]
  }
  for (bool uneven : {false, true}) {
    std::vector<int64_t> in_n = uneven ? in_counts : std::vector<int64_t>(size, 5);
    std::vector<int64_t> out_n = uneven ? out_counts : std::vector<int64_t>(size, 5);
    std::vector<float> in_host, expect;
    for (int j = 0; j < size; ++j)
      for (int64_t k = 0; k < in_n[j]; ++k) in_host.push_back(value<float>(me, 1000 * j + k));
    for (int i = 0; i < size; ++i)
      for (int64_t k = 0; k < out_n[i]; ++k) expect.push_back(value<float>(i, 1000 * me + k));
    DeviceVec<float> in(in_host), out(static_cast<int64_t>(expect.size()));
    if (uneven)
      c.all_to_all_v(out.tensor(), out_n, in.tensor(), in_n)->wait();
    else
      c.all_to_all(out.tensor(), in.tensor())->wait();
    EXPECT_EQ(out.host(), expect) << (uneven ? "all_to_all_v" : "all_to_all");
  }
}

// With --check-collectives, the planted count mismatch (count_mismatch.h) is
// the same error on every rank before anything reaches NCCL.
TEST_F(Nccl, CheckedAllToAllVCountMismatchThrowsOnEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  static std::unique_ptr<Communicator> checked = [] {
    Options o;
    o.check_collectives = true;
    return nccl_world(world(), world().rank() % cuda_device_count(), o);
  }();
  Communicator& c = *checked;
  const PlantedCountMismatch m = planted_count_mismatch(c.size(), c.rank());
  DeviceVec<float> in(c.size()), out(m.out_elements());
  try {
    c.all_to_all_v(out.tensor(), m.out_counts, in.tensor(), m.in_counts)->wait();
    FAIL() << "no error";
  } catch (const Error& e) {
    expect_count_mismatch_named(e.what(), m);
  }
  c.barrier()->wait();  // the communicator still works
}

TEST_F(Nccl, SplitByParityReachesExactlyItsMembersAndBarrierCompletes) {
  Communicator& c = nccl();
  auto half = c.split(c.rank() % 2, c.rank(), "parity");
  EXPECT_NE(half->name().find("parity"), std::string::npos) << half->name();
  DeviceVec<int64_t> bits(std::vector<int64_t>{int64_t{1} << c.rank()});
  half->all_reduce(bits.tensor(), ReduceOp::sum)->wait();
  int64_t expect = 0;
  for (int r = c.rank() % 2; r < c.size(); r += 2) expect |= int64_t{1} << r;
  EXPECT_EQ(bits.host()[0], expect);
  EXPECT_EQ(half->rank(), c.rank() / 2);
  half->barrier()->wait();
  c.barrier()->wait();
}

TEST_F(Nccl, HostTensorIsAnErrorNamingTheDevices) {
  std::vector<float> host(4);
  test::expect_error([&] { nccl().all_reduce(Tensor(host.data(), DType::f32, {4}), ReduceOp::sum); },
                     {"all_reduce", "is on cpu", "cuda:"});
}

// LOOM_NCCL_SHARE_GPU: set and neither empty nor 0 (nccl_backend.h).
TEST(NcclSetup, SharingAGpuIsAskedForInTheEnvironment) {
  const char* was = std::getenv("LOOM_NCCL_SHARE_GPU");
  const std::string before = was ? was : "";
  for (const auto& [value, shares] : {std::pair{"1", true}, {"yes", true}, {"0", false}, {"", false}}) {
    setenv("LOOM_NCCL_SHARE_GPU", value, 1);
    EXPECT_EQ(nccl_shares_gpus(), shares) << "LOOM_NCCL_SHARE_GPU='" << value << "'";
  }
  unsetenv("LOOM_NCCL_SHARE_GPU");
  EXPECT_FALSE(nccl_shares_gpus());
  if (was) setenv("LOOM_NCCL_SHARE_GPU", before.c_str(), 1);
}

// Runs on machines without a GPU too: the checks come before any collective.
TEST(NcclSetup, MissingDeviceIsAnErrorWithTheReason) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) {
    EXPECT_FALSE(why.empty());
    test::expect_error([] { nccl_world(world(), 0); }, {"nccl backend: no CUDA device: ", why});
  } else {
    test::expect_error([&] { nccl_world(world(), n); }, {"CUDA device ", "does not exist"});
    static char other_queue;  // checked before it would be used
    test::expect_error([] { nccl_world(world(), 0, {}, Stream{Device::cuda(1), &other_queue}); },
                       {"nccl backend: the compute stream given is on cuda:1, not on cuda:0"});
  }
  test::expect_error([] { nccl_world(world(), 0, Options{.timeout_s = 0}); }, {"timeout_s = 0"});
}

#endif

}  // namespace
}  // namespace loom::comm
