// Per-thread kernel scratch (src/kernels/cpu/scratch.h): reuse, growth,
// slots, alignment, the byte count over threads, per-thread slices reserved
// before an OpenMP region, impossible requests failing as loom::Error (not
// an abort), and that kernels stop growing it once a shape has been seen
// (DESIGN.md §1.4: the step loop does not allocate).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <omp.h>

#include "common/tensors.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/cpu/scratch.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

using test::expect_error;
using test::f32_view;

constexpr ScratchSlot kSlots[] = {ScratchSlot::a, ScratchSlot::b, ScratchSlot::c, ScratchSlot::d};

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST(ThreadScratch, RepeatedRequestThatFitsReturnsTheSamePointer) {
  float* first = thread_scratch<float>(ScratchSlot::a, 1000);
  const size_t bytes = scratch_bytes();
  EXPECT_EQ(thread_scratch<float>(ScratchSlot::a, 1000), first);
  EXPECT_EQ(thread_scratch<float>(ScratchSlot::a, 10), first);
  EXPECT_EQ(thread_scratch<char>(ScratchSlot::a, 4000), static_cast<void*>(first));
  EXPECT_EQ(scratch_bytes(), bytes);
}

TEST(ThreadScratch, LargerRequestGrowsTheBufferAndTheByteCount) {
  // On a fresh thread, so the count starts from this thread's zero.
  std::thread([] {
    const size_t before = scratch_bytes();
    thread_scratch<float>(ScratchSlot::b, 16);
    EXPECT_EQ(scratch_bytes(), before + 64);
    const size_t n = 1 << 20;  // 4 MiB: past glibc's mmap threshold
    float* p = thread_scratch<float>(ScratchSlot::b, n);
    EXPECT_EQ(scratch_bytes(), before + n * sizeof(float));  // replaced, not added
    p[0] = 1.f;
    p[n - 1] = 2.f;  // the whole request is usable
    EXPECT_EQ(p[0] + p[n - 1], 3.f);
  }).join();
}

TEST(ThreadScratch, DistinctSlotsGiveNonOverlappingMemory) {
  const size_t n = 3000;
  char* p[4];
  for (int i = 0; i < 4; ++i) {
    p[i] = thread_scratch<char>(kSlots[i], n);
    std::memset(p[i], i + 1, n);
  }
  for (int i = 0; i < 4; ++i) {
    for (int j = i + 1; j < 4; ++j) EXPECT_TRUE(p[i] + n <= p[j] || p[j] + n <= p[i]) << "slots " << i << ", " << j;
    EXPECT_EQ(p[i][0], i + 1);
    EXPECT_EQ(p[i][n - 1], i + 1);
  }
}

TEST(ThreadScratch, MemoryIs64ByteAlignedForAnySizeAndType) {
  for (size_t n : {0, 1, 3, 17, 1000, 100003}) {
    EXPECT_TRUE(aligned64(thread_scratch<char>(ScratchSlot::a, n))) << n;
    EXPECT_TRUE(aligned64(thread_scratch<double>(ScratchSlot::b, n))) << n;
    EXPECT_TRUE(aligned64(thread_scratch<int64_t>(ScratchSlot::c, n))) << n;
    EXPECT_TRUE(aligned64(thread_scratch<float>(ScratchSlot::d, n))) << n;
  }
}

TEST(ThreadScratch, ZeroElementsGivesAValidPointer) {
  float* p = thread_scratch<float>(ScratchSlot::d, 0);
  EXPECT_NE(p, nullptr);
  EXPECT_TRUE(aligned64(p));
  float* q = thread_scratch<float>(ScratchSlot::d, 64);
  q[63] = 1.f;
  EXPECT_EQ(q[63], 1.f);
}

TEST(ThreadScratch, ByteCountIncludesEveryLiveThreadAndDropsWhenOneExits) {
  thread_scratch<float>(ScratchSlot::a, 1);
  const size_t base = scratch_bytes();
  const size_t n = 3 << 20;
  std::atomic<int> stage{0};  // 1: the thread holds its scratch; 2: it may exit
  std::thread worker([&] {
    thread_scratch<char>(ScratchSlot::a, n);
    thread_scratch<char>(ScratchSlot::c, n);
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
  });
  while (stage.load() != 1) std::this_thread::yield();
  EXPECT_EQ(scratch_bytes(), base + 2 * n);  // n is a multiple of 64
  stage = 2;
  worker.join();
  EXPECT_EQ(scratch_bytes(), base);
}

// ---- per-thread slices for OpenMP regions -------------------------------------

TEST(ThreadSlices, ReserveBeforeTheRegionGivesEachThreadItsOwnAlignedSlice) {
  set_num_threads(4);
  for (size_t n : {0, 1, 17, 1000, 4096}) {
    SCOPED_TRACE(n);
    const ThreadSlices<float> slices(ScratchSlot::a, n);
    ASSERT_EQ(slices.threads(), omp_get_max_threads());
    ASSERT_EQ(slices.threads(), 4);
    EXPECT_EQ(slices.stride_bytes() % 64, 0u);
    EXPECT_GE(slices.stride_bytes(), std::max<size_t>(n * sizeof(float), 64));
    const size_t bytes = scratch_bytes();  // the whole reservation is made by now
    std::vector<float*> mine(4, nullptr);
    int team = 0;
#pragma omp parallel
    {
      const int t = omp_get_thread_num();
      float* p = slices.mine();
      mine[t] = p;
      std::fill(p, p + n, static_cast<float>(t));  // every thread writes its whole slice at once
#pragma omp single
      team = omp_get_num_threads();
    }
    EXPECT_EQ(team, 4);
    EXPECT_EQ(scratch_bytes(), bytes);  // nothing allocated inside the region
    for (int t = 0; t < 4; ++t) {
      ASSERT_NE(mine[t], nullptr) << t;
      EXPECT_EQ(mine[t], slices.slice(t)) << t;
      EXPECT_TRUE(aligned64(mine[t])) << t;
      for (int u = t + 1; u < 4; ++u) {
        EXPECT_NE(mine[t], mine[u]);
        EXPECT_TRUE(mine[t] + n <= mine[u] || mine[u] + n <= mine[t]) << t << ", " << u;
      }
      // No other thread wrote into this slice.
      EXPECT_TRUE(std::all_of(mine[t], mine[t] + n, [&](float x) { return x == static_cast<float>(t); })) << t;
    }
  }
}

TEST(ThreadSlices, FewerSlicesServeARegionCappedToThem) {
  set_num_threads(4);
  const ThreadSlices<double> slices(ScratchSlot::b, 3, 2);
  EXPECT_EQ(slices.threads(), 2);
  EXPECT_EQ(slices.stride_bytes(), 64u);
  std::vector<double*> mine(2, nullptr);
#pragma omp parallel num_threads(slices.threads())
  mine[omp_get_thread_num()] = slices.mine();
  EXPECT_EQ(mine[0], slices.slice(0));
  EXPECT_EQ(mine[1], slices.slice(1));
  EXPECT_EQ(reinterpret_cast<char*>(mine[1]) - reinterpret_cast<char*>(mine[0]), 64);
  EXPECT_EQ(ThreadSlices<float>(ScratchSlot::c, 8, 0).threads(), 1);  // no tasks: still one slice
}

TEST(ThreadSlices, AreOneBufferInTheCallersSlot) {
  // The slices are the calling thread's slot: a later request for that slot
  // reuses them, and a region's workers get no scratch of their own.
  std::thread([] {
    const size_t before = scratch_bytes();
    const ThreadSlices<float> slices(ScratchSlot::a, 100, 3);  // 400 -> 448 bytes a slice
    EXPECT_EQ(slices.stride_bytes(), 448u);
    EXPECT_EQ(scratch_bytes(), before + 3 * 448);
    EXPECT_EQ(thread_scratch<float>(ScratchSlot::a, 10), slices.slice(0));
  }).join();
}

// ---- impossible requests --------------------------------------------------------

TEST(ThreadScratch, ImpossibleRequestThrowsLoomErrorAndKeepsTheOldBuffer) {
  float* old = thread_scratch<float>(ScratchSlot::a, 100);
  const size_t bytes = scratch_bytes();
  // 2^62 floats: the byte count overflows size_t.
  expect_error([] { thread_scratch<float>(ScratchSlot::a, size_t{1} << 62); }, {"out of memory", "kernel scratch"});
  // Just below the overflow check: no allocator can give it.
  expect_error([] { thread_scratch<char>(ScratchSlot::a, SIZE_MAX - 64); }, {"out of memory", "kernel scratch"});
  // 2^60 bytes: fits size_t, but not the address space.
  expect_error([] { thread_scratch<char>(ScratchSlot::a, size_t{1} << 60); },
               {"out of memory: kernel scratch needs 1152921504606846976 bytes"});
  EXPECT_EQ(scratch_bytes(), bytes);
  EXPECT_EQ(thread_scratch<float>(ScratchSlot::a, 100), old);  // the slot still holds its buffer
}

TEST(ThreadSlices, ImpossibleReservationThrowsLoomErrorBeforeAnyRegion) {
  const size_t bytes = scratch_bytes();
  // Per thread: 2^62 floats overflows.
  expect_error([] { ThreadSlices<float>(ScratchSlot::b, size_t{1} << 62, 4); }, {"out of memory", "kernel scratch"});
  // Per thread fits, threads x stride overflows: 8 x 2^62 bytes.
  expect_error([] { ThreadSlices<char>(ScratchSlot::b, size_t{1} << 62, 8); }, {"out of memory", "kernel scratch"});
  // No overflow, more than the address space: 4 x 2^58 bytes.
  expect_error([] { ThreadSlices<char>(ScratchSlot::b, size_t{1} << 58, 4); }, {"out of memory", "kernel scratch"});
  EXPECT_EQ(scratch_bytes(), bytes);
}

// A kernel whose per-thread buffers cannot be had fails with a loom::Error
// that the caller can catch; this used to throw inside the OpenMP region, and
// so abort. The operands are views whose data is never read: the kernel fails
// before touching it.
TEST(ThreadScratch, KernelWhoseScratchCannotBeHadThrowsLoomError) {
  set_num_threads(2);
  const int64_t D = int64_t{1} << 46;  // 3 rows of 2^46 floats per thread: 768 TiB each
  std::vector<float> tiny(16);  // never read: the scratch request fails first
  const Tensor huge(tiny.data(), DType::f32, Shape{1, D});
  // In place (allowed); bf16 rows are converted into D floats of scratch per thread.
  const Tensor huge_bf16(tiny.data(), DType::bf16, Shape{1, D});
  expect_error([&] { softmax_forward(huge_bf16, huge_bf16); }, {"out of memory", "kernel scratch"});
  const Tensor w(tiny.data(), DType::f32, Shape{D});  // LayerNorm: 4 rows of C floats per thread
  expect_error([&] { layernorm_forward(huge, Tensor(), Tensor(), huge, w, Tensor(), 1e-5f); },
               {"out of memory", "kernel scratch"});
}

// ---- kernels in steady state -----------------------------------------------

std::vector<float> pattern(size_t n, float f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(f * static_cast<float>(i)) + 0.1f;
  return v;
}

// Large enough for the norms' parallel path (N * C >= 2^15).
struct LayerNormCase {
  static constexpr int64_t N = 64, C = 1024;
  std::vector<float> x = pattern(N * C, 0.37f), w = pattern(C, 0.11f), b = pattern(C, 0.05f);
  std::vector<float> dy = pattern(N * C, 0.23f), y = std::vector<float>(N * C);
  std::vector<float> mean = std::vector<float>(N), rstd = std::vector<float>(N);
  std::vector<float> dx = std::vector<float>(N * C), dw = std::vector<float>(C), db = std::vector<float>(C);
  LayerNormCase() {
    layernorm_forward(f32_view(y, {N, C}), f32_view(mean, {N}), f32_view(rstd, {N}), f32_view(x, {N, C}),
                      f32_view(w, {C}), f32_view(b, {C}), 1e-5f);
  }
  void backward() {
    std::fill(dx.begin(), dx.end(), 0.f);
    std::fill(dw.begin(), dw.end(), 0.f);
    std::fill(db.begin(), db.end(), 0.f);
    layernorm_backward(f32_view(dx, {N, C}), f32_view(dw, {C}), f32_view(db, {C}), f32_view(dy, {N, C}),
                       f32_view(x, {N, C}), f32_view(w, {C}), f32_view(mean, {N}), f32_view(rstd, {N}));
  }
};

TEST(ThreadScratch, LayerNormBackwardDoesNotGrowScratchOnASecondCall) {
  set_num_threads(2);
  LayerNormCase c;
  c.backward();
  const size_t after_first = scratch_bytes();
  EXPECT_GE(after_first, LayerNormCase::C * 4 * sizeof(float));  // at least one thread's rows
  c.backward();
  EXPECT_EQ(scratch_bytes(), after_first);
}

TEST(ThreadScratch, LayerNormBackwardReusingScratchGivesTheSameBits) {
  // The partial dw/db sums live in reused scratch: a second call must not see
  // the first call's sums.
  set_num_threads(2);
  LayerNormCase c;
  c.backward();
  const std::vector<float> dx = c.dx, dw = c.dw, db = c.db;
  c.backward();
  EXPECT_EQ(c.dx, dx);
  EXPECT_EQ(c.dw, dw);
  EXPECT_EQ(c.db, db);
}

TEST(ThreadScratch, RmsNormBackwardReusingScratchGivesTheSameBits) {
  set_num_threads(2);
  const int64_t N = 64, C = 1024;
  std::vector<float> x = pattern(N * C, 0.37f), w = pattern(C, 0.11f), dy = pattern(N * C, 0.23f);
  std::vector<float> y(N * C), rstd(N);
  rmsnorm_forward(f32_view(y, {N, C}), f32_view(rstd, {N}), f32_view(x, {N, C}), f32_view(w, {C}), 1e-5f);
  std::vector<float> dw_first;
  for (int call = 0; call < 2; ++call) {
    std::vector<float> dx(N * C), dw(C);
    rmsnorm_backward(f32_view(dx, {N, C}), f32_view(dw, {C}), f32_view(dy, {N, C}), f32_view(x, {N, C}),
                     f32_view(w, {C}), f32_view(rstd, {N}));
    if (call == 0) dw_first = dw;
    else EXPECT_EQ(dw, dw_first);
  }
}

TEST(ThreadScratch, AttentionForwardBackwardDoNotGrowScratchOnASecondCall) {
  set_num_threads(2);
  const int64_t B = 1, T = 100, NH = 3, HS = 64;
  const Shape s{B, T, NH, HS};
  const size_t n = B * T * NH * HS;
  std::vector<float> q = pattern(n, 0.31f), k = pattern(n, 0.17f), v = pattern(n, 0.07f), dout = pattern(n, 0.29f);
  std::vector<float> out(n), lse(B * NH * T), dq(n), dk(n), dv(n);
  auto step = [&] {
    attention_forward(f32_view(out, s), f32_view(lse, {B, NH, T}), f32_view(q, s), f32_view(k, s), f32_view(v, s));
    attention_backward(f32_view(dq, s), f32_view(dk, s), f32_view(dv, s), f32_view(dout, s), f32_view(q, s),
                       f32_view(k, s), f32_view(v, s), f32_view(out, s), f32_view(lse, {B, NH, T}));
  };
  step();
  const size_t after_first = scratch_bytes();
  step();
  EXPECT_EQ(scratch_bytes(), after_first);
}

}  // namespace
}  // namespace loom::kernels
