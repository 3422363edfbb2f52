// The kernel backend registry (src/kernels/backend.h) and the dispatch
// errors of ops.h: which backend serves which device, what registration
// refuses, and the messages for a device without a backend or operands on two
// devices.
#include <cstdlib>
#include <vector>

#include <gtest/gtest.h>

#include "common/tensors.h"
#include "kernels/backend.h"
#include "kernels/cpu_isa.h"
#include "kernels/ops.h"

namespace loom::kernels {
namespace {

constexpr DType f32 = DType::f32;

TEST(BackendRegistry, StartsWithTheCompleteCpuBackend) {
  const std::vector<const Backend*> backends = registered_backends();
  ASSERT_FALSE(backends.empty());
  EXPECT_STREQ(backends[0]->name, "cpu");
  EXPECT_EQ(backends[0], find_backend(Device::cpu()));
  EXPECT_TRUE(backend_missing_ops(*backends[0]).empty());
}

TEST(BackendRegistry, RejectsABackendThatLacksOpsAndNamesThem) {
  Backend half = cpu_backend(cpu_isa());
  half.name = "half";
  half.kind = Device::Kind::cuda;
  half.copy = nullptr;
  half.attention_backward = nullptr;
  test::expect_error([&] { register_backend(half); }, {"register_backend", "'half'", "attention_backward, copy"});
  EXPECT_EQ(find_backend(Device::cuda(0)), nullptr);
}

TEST(BackendRegistry, RejectsASecondBackendForAServedKind) {
  Backend other = cpu_backend(cpu_isa());
  other.name = "other";
  test::expect_error([&] { register_backend(other); }, {"register_backend", "'other'", "'cpu' already serves"});
  EXPECT_EQ(find_backend(Device::cpu()), &cpu_backend(cpu_isa()));
  register_backend(cpu_backend(cpu_isa()));  // the one already there: nothing changes
  EXPECT_EQ(registered_backends().size(), 1u);
}

// In a child process (the registry is per process and has no unregister): a
// second table, here the CPU functions registered for cuda devices, serves
// tensors tagged cuda and only those.
TEST(BackendRegistryDeathTest, ARegisteredBackendServesItsDeviceKind) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        static Backend cuda = cpu_backend(cpu_isa());
        cuda.name = "cpu-for-cuda";
        cuda.kind = Device::Kind::cuda;
        register_backend(cuda);
        float x[4] = {};
        fill(Tensor(x, DType::f32, {4}, Device::cuda(1)), 2.f);
        const bool served = find_backend(Device::cuda(0)) == &cuda && registered_backends().size() == 2 && x[3] == 2.f;
        std::exit(served ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(Dispatch, ATensorOnADeviceWithoutABackendIsAnErrorNamingOpOperandsAndDevice) {
  float a[6] = {}, b[6] = {}, c[4] = {};
  const Device gpu = Device::cuda(0);
  test::expect_error(
      [&] { matmul(Tensor(c, f32, {2, 2}, gpu), Tensor(a, f32, {2, 3}, gpu), Tensor(b, f32, {3, 2}, gpu)); },
      {"matmul: no kernel backend for cuda:0", "c=f32(2, 2), a=f32(2, 3), b=f32(3, 2)", "this build has: cpu"});
  std::vector<Tensor> on_gpu = {Tensor(a, f32, {6}, gpu)};
  test::expect_error([&] { global_norm(on_gpu); }, {"global_norm: no kernel backend for cuda:0", "this build has: cpu"});
}

TEST(Dispatch, OperandsOnTwoDevicesAreAnErrorNamingBoth) {
  float x[8] = {}, y[8] = {};
  test::expect_error([&] { add(Tensor(y, f32, {8}), Tensor(x, f32, {8}, Device::cuda(0)), Tensor(y, f32, {8})); },
                     {"add: y is on cpu but a is on cuda:0"});
  test::expect_error([&] { copy(Tensor(y, f32, {8}, Device::cuda(0)), Tensor(x, f32, {8}, Device::cuda(1))); },
                     {"copy: dst is on cuda:0 but src is on cuda:1"});
}

}  // namespace
}  // namespace loom::kernels
