#include "core/trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"

using namespace loom;

namespace {

// The events of a trace document other than metadata ("ph": "M").
std::vector<nlohmann::json> spans_of(const nlohmann::json& doc) {
  std::vector<nlohmann::json> out;
  for (const nlohmann::json& e : doc.at("traceEvents"))
    if (e.at("ph") == "X") out.push_back(e);
  return out;
}

void busy_for(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

TEST(Trace, NestedSpansLieInsideTheirParentInBeginOrder) {
  TraceRecorder rec(3, "rank 3");
  {
    TraceSpan outer(&rec, "step");
    {
      TraceSpan a(&rec, "forward");
      busy_for(std::chrono::microseconds(200));
    }
    {
      TraceSpan b(&rec, "backward");
      busy_for(std::chrono::microseconds(200));
    }
  }
  const nlohmann::json doc = nlohmann::json::parse(trace_document(rec.jsonl()));
  EXPECT_EQ(doc.at("displayTimeUnit"), "ms");
  const std::vector<nlohmann::json> spans = spans_of(doc);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].at("name"), "step");
  EXPECT_EQ(spans[1].at("name"), "forward");
  EXPECT_EQ(spans[2].at("name"), "backward");
  const double step_ts = spans[0].at("ts"), step_end = step_ts + spans[0].at("dur").get<double>();
  double previous_end = step_ts;
  for (size_t i = 1; i < 3; ++i) {
    const double ts = spans[i].at("ts"), dur = spans[i].at("dur");
    EXPECT_GE(dur, 200.0) << spans[i];
    EXPECT_GE(ts, previous_end) << spans[i];
    EXPECT_LE(ts + dur, step_end) << spans[i];
    EXPECT_EQ(spans[i].at("pid"), 3);
    previous_end = ts + dur;
  }
}

TEST(Trace, ProcessNameMetadataLabelsTheTrack) {
  TraceRecorder rec(5, "rank 5");
  const nlohmann::json doc = nlohmann::json::parse(trace_document(rec.jsonl()));
  ASSERT_EQ(doc.at("traceEvents").size(), 1u);
  const nlohmann::json& m = doc.at("traceEvents")[0];
  EXPECT_EQ(m.at("ph"), "M");
  EXPECT_EQ(m.at("name"), "process_name");
  EXPECT_EQ(m.at("pid"), 5);
  EXPECT_EQ(m.at("args").at("name"), "rank 5");
}

TEST(Trace, NamesWithQuotesBackslashesAndControlCharactersRoundTrip) {
  const std::string name = std::string("say \"hi\"\\ path\ttab\nline\x01\x1f end \xc3\xa9");
  TraceRecorder rec(0, "rank \"0\"");
  { TraceSpan s(&rec, name); }
  const nlohmann::json doc = nlohmann::json::parse(trace_document(rec.jsonl()));
  const std::vector<nlohmann::json> spans = spans_of(doc);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(spans[0].at("name").get<std::string>(), name);
  EXPECT_EQ(doc.at("traceEvents")[0].at("args").at("name"), "rank \"0\"");
}

TEST(Trace, MergedRecordersKeepOneTrackPerPid) {
  const auto start = TraceRecorder::Clock::now();
  TraceRecorder r0(0, "rank 0", start), r1(1, "rank 1", start);
  { TraceSpan s(&r0, "forward"); }
  { TraceSpan s(&r1, "forward"); }
  { TraceSpan s(&r1, "backward"); }
  const nlohmann::json doc = nlohmann::json::parse(trace_document(r0.jsonl() + r1.jsonl()));
  int per_pid[2] = {0, 0};
  for (const nlohmann::json& e : spans_of(doc)) ++per_pid[e.at("pid").get<int>()];
  EXPECT_EQ(per_pid[0], 1);
  EXPECT_EQ(per_pid[1], 2);
  EXPECT_EQ(doc.at("traceEvents").size(), 5u);  // two process_name events
}

TEST(Trace, EmptyTraceIsAValidDocument) {
  const nlohmann::json doc = nlohmann::json::parse(trace_document(""));
  EXPECT_TRUE(doc.at("traceEvents").empty());
}

TEST(Trace, OpenSpansAreLeftOutAndEndWithoutBeginIsABug) {
  TraceRecorder rec(0, "rank 0");
  rec.begin("still open");
  EXPECT_TRUE(spans_of(nlohmann::json::parse(trace_document(rec.jsonl()))).empty());
  rec.end();
  EXPECT_EQ(spans_of(nlohmann::json::parse(trace_document(rec.jsonl()))).size(), 1u);
  EXPECT_THROW(rec.end(), InternalError);
}

// Inside a recorded span, a span given no recorder neither throws nor
// reaches the recorder: it holds only the enclosing span, closed by its own end.
TEST(Trace, NullRecorderSpanDoesNothing) {
  TraceRecorder rec(0, "rank 0");
  {
    TraceSpan outer(&rec, "outer");
    EXPECT_NO_THROW({ TraceSpan ignored(nullptr, "ignored"); });
    ASSERT_EQ(rec.events().size(), 1u);
    EXPECT_EQ(rec.events()[0].dur_us, -1);  // still open
  }
  ASSERT_EQ(rec.events().size(), 1u);
  EXPECT_EQ(rec.events()[0].name, "outer");
  EXPECT_GE(rec.events()[0].dur_us, 0);
}
