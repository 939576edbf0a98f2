// The driver side of the JIT: without a GPU every query fails cleanly; with one, the selftest
// kernel is loaded, launched on scratch memory and its result read back.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/numeric.h"
#include "flashport/error.hpp"
#include "jit/jit.hpp"
#include "jit/test_jit_util.hpp"

namespace flashport::test {
namespace {

TEST(JitDriver, WithoutGpuQueriesFailCleanly) {
  if (jit::driver_available()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_EQ(jit::device_count(), 0);
  int host_value = 0;
  EXPECT_EQ(jit::pointer_device(&host_value), -1);
  EXPECT_EQ(jit::pointer_device(nullptr), -1);
  EXPECT_THROW(jit::device_arch(0), Error);
  EXPECT_THROW(jit::device_sm_count(0), Error);
  EXPECT_THROW(jit::alloc_async(256, nullptr), Error);
  EXPECT_THROW(jit::get(selftest_spec(80), 0, 0), Error);
  EXPECT_NO_THROW(jit::free_async(nullptr, nullptr));
  EXPECT_FALSE(jit::driver_available());  // stable on repeated calls
}

TEST(JitDriver, SelftestRunsOnTheGpu) {
  if (!jit::driver_available()) GTEST_SKIP() << "no GPU";
  ScopedCacheDir cache;
  ASSERT_GT(jit::device_count(), 0);
  const int arch = jit::device_arch(0);
  EXPECT_GE(arch, 50);
  EXPECT_GT(jit::device_sm_count(0), 0);
  int host_value = 0;
  EXPECT_EQ(jit::pointer_device(&host_value), -1);

  // The test reads results back with the driver directly; the library offers no copies.
  void* libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(libcuda, nullptr);
  using CopyDtoH = int (*)(void*, unsigned long long, size_t);
  using Synchronize = int (*)();
  auto copy_dtoh = reinterpret_cast<CopyDtoH>(dlsym(libcuda, "cuMemcpyDtoH_v2"));
  auto synchronize = reinterpret_cast<Synchronize>(dlsym(libcuda, "cuCtxSynchronize"));
  ASSERT_TRUE(copy_dtoh && synchronize);

  const int n = 1000;
  const auto spec = selftest_spec(arch);
  const jit::Kernel& kernel = jit::get(spec, 0, 0);
  EXPECT_EQ(&kernel, &jit::get(spec, 0, 0));  // loaded once
  EXPECT_EQ(kernel.device, 0);
  void* in = jit::alloc_async(n * 2, nullptr);
  void* out = jit::alloc_async(n * 2, nullptr);
  EXPECT_EQ(jit::pointer_device(in), 0);
  jit::memset_async(in, 0x3C, n * 2, nullptr);   // every f16 = 0x3C3C = 1.05859375
  jit::memset_async(out, 0xFF, n * 2, nullptr);  // poison
  int count = n;
  void* args[] = {&in, &out, &count};
  jit::launch(kernel, (n + 127) / 128, 1, 1, 128, 0, nullptr, args);
  std::vector<unsigned short> host(n);
  ASSERT_EQ(synchronize(), 0);
  ASSERT_EQ(copy_dtoh(host.data(), reinterpret_cast<unsigned long long>(out), n * 2), 0);
  jit::free_async(in, nullptr);
  jit::free_async(out, nullptr);
  ASSERT_EQ(synchronize(), 0);
  const float expected = std::exp2(num::f16_to_f32(0x3C3C));
  for (int i = 0; i < n; ++i) {
    ASSERT_NEAR(num::bf16_to_f32(host[i]), expected, expected * 1e-2f) << "element " << i;
  }
}

}  // namespace
}  // namespace flashport::test
