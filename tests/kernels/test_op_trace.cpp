// kernels/op_trace.h: the op tracer times each op a thread calls, as a span
// on its recorder and a row of its table, and nothing else.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/tensors.h"
#include "core/error.h"
#include "core/trace.h"
#include "kernels/backend.h"
#include "kernels/op_trace.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

size_t op_index(const char* name) {
  const auto names = backend_op_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (std::strcmp(names[i], name) == 0) return i;
  ADD_FAILURE() << "no op " << name;
  return 0;
}

TEST(OpTrace, EachOpCallIsASpanNestedInTheOpenOneAndARowOfTheTable) {
  std::vector<float> a(1000, 1.5f), b(1000, 2.0f), y(1000);
  const Tensor ta(a.data(), DType::f32, {1000}), tb(b.data(), DType::f32, {1000}), ty(y.data(), DType::f32, {1000});
  TraceRecorder rec(0, "rank 0");
  {
    OpTracer tracer(rec);
    {
      TraceSpan span(&rec, "phase");
      for (int i = 0; i < 3; ++i) add(ty, ta, tb);
      mul(ty, ta, tb);
    }
    EXPECT_EQ(tracer.totals(op_index("add"), Device::Kind::cpu).calls, 3);
    EXPECT_EQ(tracer.totals(op_index("mul"), Device::Kind::cpu).calls, 1);
    EXPECT_EQ(tracer.totals(op_index("mul"), Device::Kind::cpu).device_us, -1);  // the CPU has no device clock
    EXPECT_EQ(tracer.totals(op_index("scale"), Device::Kind::cpu).calls, 0);
    const std::string table = tracer.table();
    EXPECT_NE(table.find("add"), std::string::npos) << table;
    EXPECT_NE(table.find("mul"), std::string::npos) << table;
    EXPECT_EQ(table.find("scale"), std::string::npos) << table;
  }
  EXPECT_EQ(y[7], 3.0f);  // the op ran
  const std::vector<TraceEvent>& ev = rec.events();
  ASSERT_EQ(ev.size(), 5u);
  EXPECT_EQ(ev[0].name, "phase");
  for (size_t i = 1; i < ev.size(); ++i) {
    EXPECT_EQ(ev[i].name, i < 4 ? "add" : "mul");
    EXPECT_EQ(ev[i].tid, 0);
    EXPECT_GE(ev[i].start_us, ev[0].start_us);
    EXPECT_LE(ev[i].start_us + ev[i].dur_us, ev[0].start_us + ev[0].dur_us);
    if (i > 1) EXPECT_GE(ev[i].start_us, ev[i - 1].start_us + ev[i - 1].dur_us);
  }
}

TEST(OpTrace, OnlyTheTracersThreadIsTimedAndOnlyWhileItLives) {
  std::vector<float> x(64, 1.0f);
  const Tensor t(x.data(), DType::f32, {64});
  TraceRecorder rec(0, "rank 0");
  {
    OpTracer tracer(rec);
    std::thread other([&] { scale(t, 2.0f); });  // another thread: untimed, and never touches rec
    other.join();
    scale(t, 0.5f);
    EXPECT_EQ(tracer.totals(op_index("scale"), Device::Kind::cpu).calls, 1);
    EXPECT_THROW(OpTracer second(rec), Error);
  }
  scale(t, 2.0f);  // after the tracer: untimed
  EXPECT_EQ(rec.events().size(), 1u);
  EXPECT_EQ(x[0], 2.0f);
  OpTracer again(rec);  // the thread may be traced again
  scale(t, 1.0f);
  EXPECT_EQ(again.totals(op_index("scale"), Device::Kind::cpu).calls, 1);
}

TEST(OpTrace, AnOpThatThrowsStillClosesItsSpan) {
  std::vector<float> a(4), b(5);
  TraceRecorder rec(0, "rank 0");
  OpTracer tracer(rec);
  // Shapes are checked before dispatch: no span. A bad token id is found by
  // the backend, inside the span, which must still end.
  EXPECT_THROW(add(Tensor(a.data(), DType::f32, {4}), Tensor(a.data(), DType::f32, {4}),
                   Tensor(b.data(), DType::f32, {5})),
               Error);
  std::vector<int32_t> ids{0, 99};
  std::vector<float> wte(4 * 8), out(2 * 8);
  EXPECT_THROW(embedding_forward(Tensor(out.data(), DType::f32, {1, 2, 8}), Tensor(ids.data(), DType::i32, {1, 2}),
                                 Tensor(wte.data(), DType::f32, {4, 8}), Tensor(), 0),
               Error);
  EXPECT_EQ(tracer.totals(op_index("embedding_forward"), Device::Kind::cpu).calls, 1);
  TraceSpan after(&rec, "after");  // the recorder's stack is balanced
  EXPECT_EQ(rec.events().back().name, "after");
}

}  // namespace
}  // namespace loom::kernels
