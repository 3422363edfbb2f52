// loom's ring algorithms on an in-memory transport: one thread per rank, so
// every world size and element count is checked in one process.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/ring.h"
#include "core/error.h"

namespace loom::comm {
namespace {

// Rendezvous semantics, the strictest MPI allows: a send completes only when
// a receive has taken it, so a ring that relied on buffering would hang.
class Fabric {
 public:
  struct Op {
    const void* src = nullptr;
    void* dst = nullptr;
    size_t bytes = 0;
    bool done = false;
  };

  std::shared_ptr<Op> send(int from, int to, const void* data, size_t bytes) {
    std::lock_guard lock(m_);
    auto op = std::make_shared<Op>(Op{data, nullptr, bytes});
    auto& ch = channels_[{from, to}];
    if (!ch.recvs.empty()) {
      match(*op, *ch.recvs.front());
      ch.recvs.pop_front();
    } else {
      ch.sends.push_back(op);
    }
    return op;
  }
  std::shared_ptr<Op> recv(int from, int to, void* data, size_t bytes) {
    std::lock_guard lock(m_);
    auto op = std::make_shared<Op>(Op{nullptr, data, bytes});
    auto& ch = channels_[{from, to}];
    if (!ch.sends.empty()) {
      match(*ch.sends.front(), *op);
      ch.sends.pop_front();
    } else {
      ch.recvs.push_back(op);
    }
    return op;
  }
  void wait(const Op& op) {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return op.done; });
  }
  // Every channel empty: nothing sent without a receive, or posted twice.
  bool drained() const {
    for (const auto& [key, ch] : channels_)
      if (!ch.sends.empty() || !ch.recvs.empty()) return false;
    return true;
  }

 private:
  struct Channel {
    std::deque<std::shared_ptr<Op>> sends, recvs;
  };
  void match(Op& s, Op& r) {
    // Both ends cut a chunk into the same pieces, so sizes agree exactly.
    EXPECT_EQ(s.bytes, r.bytes);
    std::memcpy(r.dst, s.src, std::min(s.bytes, r.bytes));
    s.done = r.done = true;
    cv_.notify_all();
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::pair<int, int>, Channel> channels_;
};

class MemP2p : public P2p {
 public:
  MemP2p(Fabric& f, int rank, int size) : f_(f), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int isend(const void* data, size_t bytes, int peer) override {
    ops_.push_back(f_.send(rank_, peer, data, bytes));
    return static_cast<int>(ops_.size()) - 1;
  }
  int irecv(void* data, size_t bytes, int peer) override {
    ops_.push_back(f_.recv(peer, rank_, data, bytes));
    return static_cast<int>(ops_.size()) - 1;
  }
  void wait(int h) override { f_.wait(*ops_.at(h)); }
  void wait_all() override {
    for (auto& op : ops_) f_.wait(*op);
    ops_.clear();
  }

 private:
  Fabric& f_;
  int rank_, size_;
  std::vector<std::shared_ptr<Fabric::Op>> ops_;
};

// Runs body(p2p) on `size` threads, one per rank.
void run_ranks(int size, const std::function<void(P2p&)>& body) {
  Fabric fabric;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      MemP2p p2p(fabric, r, size);
      body(p2p);
    });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(fabric.drained());
}

// Small integers: sums are exact in f32 in any order.
template <typename T>
T value(int rank, int64_t i) {
  return static_cast<T>((rank * 7 + i * 13) % 31 - 15);
}

template <typename T>
std::vector<T> expected(int size, int64_t n, ReduceOp op) {
  std::vector<T> e(n);
  for (int64_t i = 0; i < n; ++i) {
    T acc = value<T>(0, i);
    for (int r = 1; r < size; ++r) acc = op == ReduceOp::max ? std::max(acc, value<T>(r, i)) : acc + value<T>(r, i);
    e[i] = op == ReduceOp::avg ? acc / static_cast<T>(size) : acc;
  }
  return e;
}

const int kSizes[] = {1, 2, 3, 5, 8};

std::vector<int64_t> counts_for(int size) { return {0, 1, size - 1, size + 1, 1000, 100003}; }

template <typename T>
void check_all_reduce(ReduceOp op, size_t piece_bytes) {
  for (int size : kSizes)
    for (int64_t n : counts_for(size)) {
      std::vector<std::vector<T>> bufs(size);
      run_ranks(size, [&](P2p& p2p) {
        auto& b = bufs[p2p.rank()];
        b.resize(n);
        for (int64_t i = 0; i < n; ++i) b[i] = value<T>(p2p.rank(), i);
        std::vector<std::byte> scratch;
        ring_all_reduce(p2p, b.data(), n, dtype_of<T>::value, op, scratch, RingConfig{piece_bytes});
      });
      const auto e = expected<T>(size, n, op);
      for (int r = 0; r < size; ++r) ASSERT_EQ(bufs[r], e) << "size " << size << " n " << n << " rank " << r;
    }
}

TEST(RingAllReduce, MatchesDirectSumForAnyCountAndWorldSize) {
  check_all_reduce<float>(ReduceOp::sum, 256 << 10);
  check_all_reduce<int32_t>(ReduceOp::sum, 256 << 10);
  check_all_reduce<int64_t>(ReduceOp::sum, 256 << 10);
}

TEST(RingAllReduce, MatchesDirectMaxAndAvg) {
  check_all_reduce<float>(ReduceOp::max, 256 << 10);
  check_all_reduce<int64_t>(ReduceOp::max, 256 << 10);
  check_all_reduce<float>(ReduceOp::avg, 256 << 10);
}

TEST(RingAllReduce, SmallPiecesPipelineManyMessagesPerStep) {
  check_all_reduce<float>(ReduceOp::sum, 64);
  check_all_reduce<int32_t>(ReduceOp::sum, 4);
}

TEST(RingReduceScatter, OwnChunkIsTheReductionOfShardRange) {
  for (int size : kSizes)
    for (int64_t n : counts_for(size)) {
      std::vector<std::vector<float>> bufs(size);
      run_ranks(size, [&](P2p& p2p) {
        auto& b = bufs[p2p.rank()];
        b.resize(n);
        for (int64_t i = 0; i < n; ++i) b[i] = value<float>(p2p.rank(), i);
        std::vector<std::byte> scratch;
        ring_reduce_scatter(p2p, b.data(), n, DType::f32, ReduceOp::sum, scratch, RingConfig{1024});
      });
      const auto e = expected<float>(size, n, ReduceOp::sum);
      for (int r = 0; r < size; ++r) {
        const Range own = shard_range(n, size, r);
        for (int64_t i = own.offset; i < own.offset + own.count; ++i)
          ASSERT_EQ(bufs[r][i], e[i]) << "size " << size << " n " << n << " rank " << r << " i " << i;
      }
    }
}

TEST(RingAllGather, EveryRankGetsEveryShardInRankOrder) {
  for (int size : kSizes)
    for (int64_t n : counts_for(size)) {
      std::vector<std::vector<uint16_t>> bufs(size);  // 2-byte elements, as bf16
      run_ranks(size, [&](P2p& p2p) {
        auto& b = bufs[p2p.rank()];
        b.assign(n, 0xffff);
        const Range own = shard_range(n, size, p2p.rank());
        for (int64_t i = own.offset; i < own.offset + own.count; ++i) b[i] = static_cast<uint16_t>(i * 3 + 1);
        ring_all_gather(p2p, b.data(), n, sizeof(uint16_t), RingConfig{512});
      });
      for (int r = 0; r < size; ++r)
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bufs[r][i], static_cast<uint16_t>(i * 3 + 1));
    }
}

TEST(ShardRange, ContiguousInRankOrderFirstRanksHoldOneMore) {
  EXPECT_EQ(shard_range(10, 3, 0).offset, 0);
  EXPECT_EQ(shard_range(10, 3, 0).count, 4);
  EXPECT_EQ(shard_range(10, 3, 1).offset, 4);
  EXPECT_EQ(shard_range(10, 3, 1).count, 3);
  EXPECT_EQ(shard_range(10, 3, 2).offset, 7);
  EXPECT_EQ(shard_range(10, 3, 2).count, 3);
  EXPECT_EQ(shard_range(2, 4, 3).count, 0);
  EXPECT_EQ(shard_range(2, 4, 3).offset, 2);
  for (int64_t n : {0, 1, 7, 100}) {
    int64_t next = 0;
    for (int r = 0; r < 7; ++r) {
      EXPECT_EQ(shard_range(n, 7, r).offset, next);
      next += shard_range(n, 7, r).count;
    }
    EXPECT_EQ(next, n);
  }
}

TEST(AlgoNames, RoundTripAndUnknownNameListsTheAllowedOnes) {
  EXPECT_EQ(algo_from_name(algo_name(Algo::mpi)), Algo::mpi);
  EXPECT_EQ(algo_from_name(algo_name(Algo::ring)), Algo::ring);
  EXPECT_EQ(reduce_op_name(ReduceOp::avg), "avg");
  try {
    algo_from_name("tree");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown communication algorithm 'tree': allowed values are mpi, ring");
  }
}

}  // namespace
}  // namespace loom::comm
