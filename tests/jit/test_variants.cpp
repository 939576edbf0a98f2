// Every kernel variant the CUDA dispatcher can pick compiles with NVRTC for sm_80 and sm_90a, no kernel
// spills, and every sm_90a kernel keeps the launch-order contract of grid_dependency.cuh. Prints the
// register table.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>

#include "jit/jit.hpp"
#if __has_include("backends/cuda/variants.hpp")
#include "backends/cuda/variants.hpp"
#define FLASHPORT_HAVE_VARIANTS 1
#endif

namespace flashport::test {
namespace {

class JitVariants : public testing::TestWithParam<int> {};

// griddepcontrol.wait (SASS ACQBULK) and griddepcontrol.launch_dependents (PREEXIT) on sm_90: the low 64
// bits of each 128-bit instruction, which a cubin's text stores little-endian at 16-byte aligned offsets.
constexpr uint64_t kSassAcqBulk = 0x782e, kSassPreExit = 0x782d;

bool has_instruction(const std::vector<char>& cubin, uint64_t low_word) {
  for (size_t at = 0; at + 16 <= cubin.size(); at += 16) {
    uint64_t word;
    std::memcpy(&word, cubin.data() + at, sizeof word);
    if (word == low_word) return true;
  }
  return false;
}

TEST_P(JitVariants, AllCompileAndMainKernelsDoNotSpill) {
#ifndef FLASHPORT_HAVE_VARIANTS
  GTEST_SKIP() << "src/backends/cuda/variants.hpp not there yet";
#else
  // Uses the regular disk cache ($FLASHPORT_CACHE_DIR or ~/.cache/flashport): cached entries keep
  // the ptxas register/spill counts, so reruns check the same facts in seconds.
  const int arch = GetParam();
  const std::vector<jit::KernelSpec> specs = cuda::all_variants(arch);
  ASSERT_FALSE(specs.empty());
  const auto paths = jit::embedded_paths();
  std::set<std::string> keys;
  for (const auto& spec : specs) {
    EXPECT_EQ(spec.arch, arch) << spec.key();
    EXPECT_TRUE(keys.insert(spec.key()).second) << "duplicate variant " << spec.key();
    EXPECT_NE(std::find(paths.begin(), paths.end(), spec.source), paths.end()) << spec.key();
  }

  struct Row {
    jit::CompileResult result;
    std::string error;
  };
  std::vector<Row> rows(specs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      try {
        rows[i].result = jit::compile(specs[i]);
      } catch (const std::exception& e) {
        rows[i].error = e.what();
      }
    }
  };
  std::thread helper(worker);
  worker();
  helper.join();

  std::printf("%-90s %5s %6s %7s\n", "kernel", "regs", "spill", "seconds");
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& r = rows[i].result;
    const bool main = cuda::is_main_kernel(specs[i]);
    std::printf("%-90s %5d %6d %7.1f %s%s\n", specs[i].key().c_str(), r.registers, r.spill_bytes, r.seconds,
                main ? "main" : "", r.from_cache ? " cached" : "");
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& row = rows[i];
    EXPECT_EQ(row.error, "") << specs[i].key();
    if (!row.error.empty()) continue;
    EXPECT_GT(row.result.registers, 0) << specs[i].key();
    // Every kernel, not only the attention main loops: an 8-byte spill in split_combine once went
    // unnoticed until an H200 prebuild listed it.
    EXPECT_EQ(row.result.spill_bytes, 0) << (cuda::is_main_kernel(specs[i]) ? "main kernel" : "kernel")
                                         << " spills: " << specs[i].key() << "\n"
                                         << row.result.log;
    // jit::launch overlaps sm_90 kernels with their predecessors: one that does not wait for them races.
    const bool waits = has_instruction(row.result.cubin, kSassAcqBulk);
    const bool releases = has_instruction(row.result.cubin, kSassPreExit);
    EXPECT_EQ(waits, arch >= 90) << "griddepcontrol.wait: " << specs[i].key();
    EXPECT_EQ(releases, arch >= 90) << "griddepcontrol.launch_dependents: " << specs[i].key();
  }
#endif
}

INSTANTIATE_TEST_SUITE_P(Archs, JitVariants, testing::Values(80, 90));

}  // namespace
}  // namespace flashport::test
