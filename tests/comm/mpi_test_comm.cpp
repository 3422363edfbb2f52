// The MPI backend at every world size (tests/mpi.cmake runs this at 1, 2, 3,
// 4 and 8 ranks). Every rank fills its input from a formula of (rank,
// index), so every rank computes the expected output locally.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/mpi_backend.h"
#include "common/mpi_env.h"
#include "core/error.h"

namespace loom::comm {
namespace {

using test::world;

// The world again with the given options (a collective call: every rank
// makes the same calls in the same order).
Communicator& world_with(Algo algo, bool check = false) {
  static std::unique_ptr<Communicator> comms[2][2];
  auto& c = comms[static_cast<int>(algo)][check];
  if (!c) c = mpi_world(Options{300, algo, check});
  return *c;
}

const Algo kAlgos[] = {Algo::mpi, Algo::ring};

// Storage of each dtype, converted through double.
template <typename T> T store(double x) { return static_cast<T>(x); }
template <> bf16 store<bf16>(double x) { return to_bf16(static_cast<float>(x)); }
template <typename T> double load(T x) { return static_cast<double>(x); }
template <> double load<bf16>(bf16 x) { return from_bf16(x); }

// Small halves (floats) or integers (with a high bit for i64): every sum over
// up to 8 ranks is exact in every dtype, in any order.
template <typename T>
double value(int rank, int64_t i) {
  const double v = static_cast<double>((rank * 7 + i * 13) % 31 - 15);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bf16>) return v * 0.5;
  if constexpr (std::is_same_v<T, int64_t>) return v + static_cast<double>(int64_t{rank} << 33);
  return v;
}

template <typename T>
std::vector<T> filled(int rank, int64_t n) {
  std::vector<T> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = store<T>(value<T>(rank, i));
  return v;
}

// op over ranks of value(r, i), computed as the backend does (avg: f32 sum / size).
template <typename T>
T reduced(int size, int64_t i, ReduceOp op) {
  double acc = value<T>(0, i);
  for (int r = 1; r < size; ++r) acc = op == ReduceOp::max ? std::max(acc, value<T>(r, i)) : acc + value<T>(r, i);
  if (op == ReduceOp::avg) return store<T>(static_cast<float>(acc) / static_cast<float>(size));
  return store<T>(acc);
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <typename T>
Tensor view(std::vector<T>& v) {
  return Tensor(v.data(), dtype_of<T>::value, {static_cast<int64_t>(v.size())});
}

std::vector<int64_t> counts(int size) { return {0, 1, size - 1, size + 1, 4099}; }
constexpr int64_t kLarge = 1000003;

template <typename T>
void check_all_reduce(Communicator& c, int64_t n, ReduceOp op) {
  auto buf = filled<T>(c.rank(), n);
  c.all_reduce(view(buf), op)->wait();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(load(buf[i]), load(reduced<T>(c.size(), i, op)))
        << dtype_name(dtype_of<T>::value) << " " << reduce_op_name(op) << " n " << n << " i " << i;
}

template <typename T>
void check_reduce_scatter(Communicator& c, int64_t n, ReduceOp op) {
  auto in = filled<T>(c.rank(), n);
  const Range own = shard_range(n, c.size(), c.rank());
  std::vector<T> out(own.count);
  c.reduce_scatter(view(out), view(in), op)->wait();
  for (int64_t i = 0; i < own.count; ++i)
    ASSERT_EQ(load(out[i]), load(reduced<T>(c.size(), own.offset + i, op))) << "n " << n << " i " << i;
  ASSERT_TRUE(same_bits(in, filled<T>(c.rank(), n))) << "reduce_scatter changed its input";
}

template <typename T>
void check_all_gather(Communicator& c, int64_t n) {
  const Range own = shard_range(n, c.size(), c.rank());
  std::vector<T> in(own.count), out(n);
  for (int64_t i = 0; i < own.count; ++i) in[i] = store<T>(value<T>(c.rank(), own.offset + i));
  c.all_gather(view(out), view(in))->wait();
  for (int r = 0; r < c.size(); ++r) {
    const Range rr = shard_range(n, c.size(), r);
    for (int64_t i = rr.offset; i < rr.offset + rr.count; ++i)
      ASSERT_EQ(load(out[i]), value<T>(r, i)) << "n " << n << " i " << i;
  }
}

TEST(AllReduce, MatchesDirectComputationForEveryDtypeOpAlgoAndCount) {
  for (Algo algo : kAlgos) {
    Communicator& c = world_with(algo);
    for (int64_t n : counts(c.size())) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
        check_all_reduce<float>(c, n, op);
        check_all_reduce<bf16>(c, n, op);
      }
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
        check_all_reduce<int32_t>(c, n, op);
        check_all_reduce<int64_t>(c, n, op);
      }
    }
    check_all_reduce<float>(c, kLarge, ReduceOp::sum);
    check_all_reduce<bf16>(c, kLarge, ReduceOp::avg);
  }
}

// 256 + 1 + 1 + ...: bf16 has 8 significant bits, so adding 1 to 256 in bf16
// rounds back to 256 every time, while f32 keeps every 1 and rounds once.
TEST(AllReduce, Bf16SumAccumulatesInF32AndRoundsOnce) {
  for (Algo algo : kAlgos) {
    Communicator& c = world_with(algo);
    std::vector<bf16> buf(5, to_bf16(c.rank() == 0 ? 256.0f : 1.0f));
    c.all_reduce(view(buf), ReduceOp::sum)->wait();
    const bf16 expect = to_bf16(256.0f + static_cast<float>(c.size() - 1));
    for (bf16 x : buf) EXPECT_EQ(x.bits, expect.bits) << algo_name(algo);
    if (c.size() >= 3) {
      EXPECT_NE(from_bf16(expect), 256.0f);  // bf16-by-bf16 would give 256
    }
  }
}

TEST(ReduceScatter, OwnShardIsTheReductionForEveryDtypeAlgoAndCount) {
  for (Algo algo : kAlgos) {
    Communicator& c = world_with(algo);
    for (int64_t n : counts(c.size())) {
      check_reduce_scatter<float>(c, n, ReduceOp::sum);
      check_reduce_scatter<float>(c, n, ReduceOp::avg);
      check_reduce_scatter<bf16>(c, n, ReduceOp::sum);
      check_reduce_scatter<int32_t>(c, n, ReduceOp::max);
      check_reduce_scatter<int64_t>(c, n, ReduceOp::sum);
    }
    check_reduce_scatter<float>(c, kLarge, ReduceOp::sum);
  }
}

TEST(AllGather, EveryRankGetsEveryShardInRankOrder) {
  for (Algo algo : kAlgos) {
    Communicator& c = world_with(algo);
    for (int64_t n : counts(c.size())) {
      check_all_gather<float>(c, n);
      check_all_gather<bf16>(c, n);
      check_all_gather<int32_t>(c, n);
      check_all_gather<int64_t>(c, n);
    }
    check_all_gather<float>(c, kLarge);
  }
}

TEST(Broadcast, EveryRankGetsTheLastRanksBuffer) {
  const int root = world().size() - 1;
  auto buf = filled<int64_t>(world().rank(), 1001);
  world().broadcast(view(buf), root)->wait();
  EXPECT_TRUE(buf == filled<int64_t>(root, 1001));
}

TEST(AllToAll, BlockJOfRankIGoesToBlockIOfRankJ) {
  Communicator& c = world();
  const int64_t block = 3;
  std::vector<int32_t> in(block * c.size()), out(block * c.size());
  for (int j = 0; j < c.size(); ++j)
    for (int64_t k = 0; k < block; ++k) in[j * block + k] = c.rank() * 1000 + j * 10 + static_cast<int>(k);
  c.all_to_all(view(out), view(in))->wait();
  for (int i = 0; i < c.size(); ++i)
    for (int64_t k = 0; k < block; ++k) EXPECT_EQ(out[i * block + k], i * 1000 + c.rank() * 10 + k);
}

// Rank i sends (i + 2j) % 3 elements to rank j: some blocks are empty.
TEST(AllToAllV, UnevenBlocksArriveInRankOrder) {
  Communicator& c = world();
  const int me = c.rank();
  auto count = [](int from, int to) { return int64_t{(from + 2 * to) % 3}; };
  std::vector<int64_t> in_counts(c.size()), out_counts(c.size());
  std::vector<float> in, out;
  for (int j = 0; j < c.size(); ++j) {
    in_counts[j] = count(me, j);
    out_counts[j] = count(j, me);
    for (int64_t k = 0; k < in_counts[j]; ++k) in.push_back(static_cast<float>(me * 100 + j * 10 + k));
  }
  out.resize(std::accumulate(out_counts.begin(), out_counts.end(), int64_t{0}));
  c.all_to_all_v(view(out), out_counts, view(in), in_counts)->wait();
  size_t at = 0;
  for (int i = 0; i < c.size(); ++i)
    for (int64_t k = 0; k < out_counts[i]; ++k) EXPECT_EQ(out[at++], static_cast<float>(i * 100 + me * 10 + k));
}

// 8 MB each way, above every eager limit: both posted before either waits.
TEST(SendRecv, ExchangeWithTheSamePeerDoesNotDeadlock) {
  Communicator& c = world();
  const int64_t n = 2 << 20;
  const int peer = (c.rank() ^ 1) < c.size() ? (c.rank() ^ 1) : c.rank();
  auto mine = filled<float>(c.rank(), n);
  std::vector<float> theirs(n);
  WorkPtr s = c.send(view(mine), peer, 7);
  WorkPtr r = c.recv(view(theirs), peer, 7);
  r->wait();
  s->wait();
  EXPECT_TRUE(std::equal(theirs.begin(), theirs.end(), filled<float>(peer, n).begin()));
}

TEST(SendRecv, RingShiftPostedBothWaysCompletes) {
  Communicator& c = world();
  const int right = (c.rank() + 1) % c.size(), left = (c.rank() + c.size() - 1) % c.size();
  auto mine = filled<int32_t>(c.rank(), 3 << 20);
  std::vector<int32_t> got(mine.size());
  WorkPtr r = c.recv(view(got), left);
  WorkPtr s = c.send(view(mine), right);
  s->wait();
  r->wait();
  EXPECT_TRUE(std::equal(got.begin(), got.end(), filled<int32_t>(left, 3 << 20).begin()));
}

TEST(Split, GroupsReachExactlyTheirMembersInKeyOrder) {
  Communicator& w = world();
  const int color = w.rank() % 2;
  auto sub = w.split(color, -w.rank(), "half");  // key -rank: members in reverse world order
  std::vector<int> members;
  for (int r = w.size() - 1; r >= 0; --r)
    if (r % 2 == color) members.push_back(r);
  ASSERT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[sub->rank()], w.rank());
  std::string name = "half[ranks ";
  for (size_t i = 0; i < members.size(); ++i) name += concat(i ? "," : "", members[i]);
  EXPECT_EQ(sub->name(), name + "]");
  std::vector<int64_t> buf{w.rank(), 1};
  sub->all_reduce(view(buf), ReduceOp::sum)->wait();
  EXPECT_EQ(buf[0], std::accumulate(members.begin(), members.end(), int64_t{0}));
  EXPECT_EQ(buf[1], static_cast<int64_t>(members.size()));
}

// Every member sees the same descriptors, so every rank throws the same message.
TEST(CheckCollectives, PlantedCountMismatchThrowsOnEveryRankNamingBothCalls) {
  if (world().size() < 2) GTEST_SKIP() << "a mismatch needs two ranks";
  Communicator& c = world_with(Algo::mpi, /*check=*/true);
  const int last = c.size() - 1;
  std::vector<float> buf(c.rank() == last ? 9 : 10, 1.0f);
  try {
    c.all_reduce(view(buf), ReduceOp::sum)->wait();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "check_collectives: collective #1 on communicator 'world' differs between ranks: rank 0 calls "
              "all_reduce(f32, 10 elements, sum) as #1, rank " + std::to_string(last) +
                  " calls all_reduce(f32, 9 elements, sum) as #1");
  }
  std::vector<float> ok(10, 1.0f);  // nothing ran, so the communicator still works
  c.all_reduce(view(ok), ReduceOp::sum)->wait();
  EXPECT_EQ(ok[9], static_cast<float>(c.size()));
}

void expect_error(const std::function<void()>& call, const std::string& text) {
  try {
    call();
    ADD_FAILURE() << "no error; expected: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(Validation, MisuseIsAnErrorNamingTheOpAndWhatIsAllowed) {
  Communicator& c = world();
  const int n = c.size();
  std::vector<float> f(8 * n * n + 8);
  std::vector<uint16_t> h(4);
  Tensor t = view(f);
  expect_error([&] { c.all_reduce(Tensor(h.data(), DType::f16, {4}), ReduceOp::sum); },
               "all_reduce on communicator 'world': buf has dtype f16: allowed dtypes are f32, bf16, i32, i64");
  Tensor grid = t.slice(0, 0, 8 * n * n).reshape({8 * n, n});
  if (n > 1)
    expect_error([&] { c.all_reduce(grid.slice(1, 0, 1), ReduceOp::sum); }, "is not contiguous");
  expect_error([&] { c.all_reduce(Tensor(f.data(), DType::f32, {4}, Device::cuda(0)), ReduceOp::sum); },
               "buf is on cuda:0 but the communicator works on cpu");
  std::vector<int32_t> ints(4);
  expect_error([&] { c.all_reduce(view(ints), ReduceOp::avg); }, "avg of i32 would truncate");
  expect_error([&] { c.reduce_scatter(t.slice(0, 0, 5), t, ReduceOp::sum); },
               concat("out has 5 elements but rank ", c.rank(), "'s shard of ", f.size()));
  expect_error([&] { c.all_gather(t, t.slice(0, 0, 5)); }, "in has 5 elements but rank");
  expect_error([&] { c.reduce_scatter(Tensor(h.data(), DType::bf16, {4}), t, ReduceOp::sum); },
               "out is bf16 but in is f32");
  expect_error([&] { c.send(t, n, 0); }, concat("send on communicator 'world': peer ", n,
                                                " is out of range: allowed 0..", n - 1));
  expect_error([&] { c.recv(t, -1, 0); }, "recv on communicator 'world': peer -1 is out of range");
  expect_error([&] { c.broadcast(t, n); }, "root");
  expect_error([&] { c.all_to_all(t, t.slice(0, 0, n * 3 + 1)); }, "equal blocks");
  std::vector<int64_t> counts(n, 1);
  expect_error([&] { c.all_to_all_v(t.slice(0, 0, n), counts, t.slice(0, 0, n + 1), counts); },
               concat("in_counts sum to ", n, " but the tensor has ", n + 1, " elements"));
  std::vector<int64_t> short_counts(n + 1, 0);
  expect_error([&] { c.all_to_all_v(t.slice(0, 0, 0), short_counts, t.slice(0, 0, 0), short_counts); },
               "entries: it needs one per rank");
}

// A caller that computes between issue and wait finds the op done: the
// engine thread drives MPI meanwhile. The op alone takes T (median of 3);
// with 3T of computation in between (the engine thread shares the core with
// the computation), wait() must take well under T/2.
TEST(Overlap, LargeAllReduceProgressesWhileTheCallerComputes) {
  if (world().size() != 2) GTEST_SKIP() << "measured at 2 ranks (one per core)";
  for (Algo algo : kAlgos) {
    Communicator& c = world_with(algo);
    std::vector<float> buf(8 << 20, 1.0f);  // 32 MB
    using Clock = std::chrono::steady_clock;
    auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::vector<double> alone, waits;
    for (int i = 0; i < 3; ++i) {
      c.barrier()->wait();
      const auto t0 = Clock::now();
      c.all_reduce(view(buf), ReduceOp::sum)->wait();
      alone.push_back(seconds(Clock::now() - t0));
    }
    float op_s = static_cast<float>(median(alone));  // the same compute time on both ranks: the slower one's
    c.all_reduce(Tensor(&op_s, DType::f32, {1}), ReduceOp::max)->wait();
    volatile double sink = 0;
    for (int i = 0; i < 3; ++i) {
      c.barrier()->wait();
      WorkPtr w = c.all_reduce(view(buf), ReduceOp::sum);
      const auto until = Clock::now() + std::chrono::duration<double>(3 * op_s);
      while (Clock::now() < until)
        for (int k = 0; k < 1000; ++k) sink = sink + 1e-9 * k;
      const auto t1 = Clock::now();
      w->wait();
      waits.push_back(seconds(Clock::now() - t1));
    }
    const double wait_s = median(waits);
    if (c.rank() == 0)
      std::printf("overlap %s: all_reduce 32 MB alone %.2f ms, wait after 3x compute %.3f ms (%.0f%%)\n",
                  std::string(algo_name(algo)).c_str(), op_s * 1e3, wait_s * 1e3, 100 * wait_s / op_s);
    EXPECT_LT(wait_s, 0.5 * op_s) << algo_name(algo);
  }
}

}  // namespace
}  // namespace loom::comm
