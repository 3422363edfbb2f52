// SelfCommunicator (comm/self_communicator.h): the one-rank communicator of a
// run without mpirun. Its collectives must leave a rank's values exactly as
// a group of one would, so that a one-process run computes what it did when
// it had no groups at all.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "comm/self_communicator.h"
#include "core/error.h"

namespace loom::comm {
namespace {

Tensor view(std::vector<float>& v) { return Tensor(v.data(), DType::f32, {static_cast<int64_t>(v.size())}); }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SelfCommunicator, ReductionsOverOneRankLeaveEveryBitAsItWas) {
  SelfCommunicator self;
  const std::vector<float> before = {1.f / 3.f, -0.f, 1e-38f, std::numeric_limits<float>::infinity(), 7.25f};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    std::vector<float> v = before;
    EXPECT_TRUE(self.all_reduce(view(v), op)->test());
    EXPECT_TRUE(same_bits(v, before)) << reduce_op_name(op);
  }
}

TEST(SelfCommunicator, ReduceScatterAndAllGatherCopyTheWholeBuffer) {
  SelfCommunicator self;
  std::vector<float> in = {1, 2, 3, 4}, out(4, 0.f);
  self.reduce_scatter(view(out), view(in), ReduceOp::avg)->wait();
  EXPECT_TRUE(same_bits(out, in));
  std::vector<float> gathered(4, 0.f);
  self.all_gather(view(gathered), view(in))->wait();
  EXPECT_TRUE(same_bits(gathered, in));
  self.all_gather(view(in), view(in))->wait();  // in place: the rank's own range is the whole buffer
  EXPECT_EQ(in[3], 4.f);
}

TEST(SelfCommunicator, ASendToItselfReachesTheMatchingRecvInEitherOrder) {
  SelfCommunicator self;
  std::vector<float> a = {1, 2}, b = {3, 4}, got_b(2), got_a(2);
  WorkPtr recv_first = self.recv(view(got_a), 0, /*tag=*/1);
  EXPECT_FALSE(recv_first->test());
  WorkPtr send_b = self.send(view(b), 0, /*tag=*/2);  // no recv yet: waits for it
  EXPECT_FALSE(send_b->test());
  self.send(view(a), 0, 1)->wait();
  EXPECT_TRUE(recv_first->test());
  self.recv(view(got_b), 0, 2)->wait();
  EXPECT_TRUE(send_b->test());
  EXPECT_EQ(got_a, a);
  EXPECT_EQ(got_b, b);
}

TEST(SelfCommunicator, ARecvThatNoSendMatchesFailsOnWaitInsteadOfHanging) {
  SelfCommunicator self;
  std::vector<float> buf(1);
  WorkPtr w = self.recv(view(buf), 0, 5);
  EXPECT_THROW(w->wait(), InternalError);  // a program bug, not a user error
}

TEST(SelfCommunicator, ArgumentsAreValidatedAsEveryBackendDoes) {
  SelfCommunicator self("world");
  std::vector<float> v(3);
  try {
    self.send(view(v), 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
  std::vector<int32_t> ints(2);
  EXPECT_THROW(self.all_reduce(Tensor(ints.data(), DType::i32, {2}), ReduceOp::avg), Error);
  std::vector<float> small(2);
  EXPECT_THROW(self.reduce_scatter(view(small), view(v), ReduceOp::sum), Error);
}

TEST(SelfCommunicator, SplitGivesAnotherGroupOfOneWithItsName) {
  SelfCommunicator self;
  const std::unique_ptr<Communicator> g = self.split(3, 0, "tp");
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->name(), "tp");
}

}  // namespace
}  // namespace loom::comm
