// NVRTC compilation of the embedded selftest kernel: cubins for sm_80 and sm_90a, ptxas resource
// parsing, embedded-source lookup, and compiler errors that name the kernel.
#include <gtest/gtest.h>

#include <algorithm>

#include "flashport/error.hpp"
#include "jit/detail.hpp"
#include "jit/jit.hpp"
#include "jit/test_jit_util.hpp"

namespace flashport::test {
namespace {

TEST(JitSources, EmbeddedTableHoldsKernelsAndCoreHeaders) {
  const auto paths = jit::embedded_paths();
  for (const char* expected :
       {"cuda/jit_selftest.cu", "core/problem.h", "core/semantics.h", "core/numeric.h"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), expected), paths.end()) << expected;
  }
  EXPECT_NE(jit::embedded_source("cuda/jit_selftest.cu").find("flashport_jit_selftest"), std::string::npos);
  EXPECT_THROW(jit::embedded_source("cuda/no_such_kernel.cu"), Error);
}

TEST(JitSources, RelativeIncludesAreRewrittenToTablePaths) {
  // NVRTC matches in-memory header names exactly, so "semantics.h" included from core/problem.h
  // must become "core/semantics.h"; line count stays the same for compiler diagnostics.
  const std::string& problem = jit::embedded_source("core/problem.h");
  EXPECT_NE(problem.find("#include \"core/semantics.h\""), std::string::npos);
  EXPECT_EQ(problem.find("#include \"semantics.h\""), std::string::npos);
}

TEST(JitSpec, KeyListsSourceEntryArchAndDefines) {
  const jit::KernelSpec spec{"cuda/x.cu", "entry", {{"A", "1"}, {"B", "f16"}}, 86};
  EXPECT_EQ(spec.key(), "cuda/x.cu:entry:86:A=1,B=f16");
}

class JitCompileArch : public testing::TestWithParam<int> {};

TEST_P(JitCompileArch, SelftestGivesCubinWithResourceInfo) {
  ScopedCacheDir cache;
  const int arch = GetParam();
  const auto result = jit::compile(selftest_spec(arch));
  EXPECT_TRUE(is_elf(result.cubin));
  EXPECT_FALSE(result.from_cache);
  EXPECT_GT(result.seconds, 0.0);
  EXPECT_GT(result.registers, 0) << result.log;
  EXPECT_LT(result.registers, 64) << result.log;
  EXPECT_EQ(result.spill_bytes, 0) << result.log;
  const std::string target = arch == 90 ? "'sm_90a'" : "'sm_" + std::to_string(arch) + "'";
  EXPECT_NE(result.log.find("Compiling entry function 'flashport_jit_selftest' for " + target),
            std::string::npos)
      << result.log;
}

INSTANTIATE_TEST_SUITE_P(Archs, JitCompileArch, testing::Values(80, 90));

TEST(JitCompile, DefinesSpecialiseTheKernel) {
  ScopedCacheDir cache;
  const auto plain = jit::compile(selftest_spec(80));
  const auto scaled = jit::compile(selftest_spec(80, {{"SELFTEST_SCALE", "0.5f"}}));
  EXPECT_NE(plain.cubin, scaled.cubin);
  EXPECT_NE(jit::cache_file(selftest_spec(80)),
            jit::cache_file(selftest_spec(80, {{"SELFTEST_SCALE", "0.5f"}})));
  EXPECT_NE(jit::cache_file(selftest_spec(80)), jit::cache_file(selftest_spec(90)));
}

TEST(JitCompile, SyntaxErrorNamesKernelAndCompilerLine) {
  ScopedCacheDir cache;
  const auto spec = selftest_spec(80, {{"SELFTEST_BREAK", "1"}});
  try {
    jit::compile(spec);
    FAIL() << "compiling a broken source must throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("kernel " + spec.key()), std::string::npos) << message;
    EXPECT_NE(message.find("cuda/jit_selftest.cu("), std::string::npos) << message;  // file(line): error
    EXPECT_NE(message.find("error"), std::string::npos) << message;
    EXPECT_NE(message.find("selftest_broken"), std::string::npos) << message;  // the offending line
  }
  EXPECT_TRUE(cache.files().empty());  // failures are not cached
}

TEST(JitCompile, UnknownSourceAndEntryAreErrors) {
  ScopedCacheDir cache;
  const jit::KernelSpec missing{"cuda/no_such_kernel.cu", "k", {}, 80};
  try {
    jit::compile(missing);
    FAIL() << "unknown source must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing.key()), std::string::npos) << e.what();
  }
}

TEST(JitPtxas, ParsesRegistersAndSpillsOfTheRequestedEntry) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Function properties for helper\n"
      "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Compiling entry function 'other' for 'sm_80'\n"
      "ptxas info    : Function properties for other\n"
      "ptxas         .     0 bytes stack frame, 100 bytes spill stores, 100 bytes spill loads\n"
      "ptxas info    : Used 255 registers, used 1 barriers, 400 bytes cmem[0]\n"
      "ptxas info    : Compiling entry function 'main_kernel' for 'sm_80'\n"
      "ptxas info    : Function properties for main_kernel\n"
      "ptxas         .     16 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads\n"
      "ptxas info    : Used 168 registers, used 1 barriers, 400 bytes cmem[0]\n";
  int registers = 0, spills = 0;
  jit::detail::parse_ptxas_info(log, "main_kernel", &registers, &spills);
  EXPECT_EQ(registers, 168);
  EXPECT_EQ(spills, 12 + 20 + 4 + 4);  // its own plus the non-entry helper's, not 'other's
  jit::detail::parse_ptxas_info(log, "other", &registers, &spills);
  EXPECT_EQ(registers, 255);
  EXPECT_EQ(spills, 200 + 8);
  jit::detail::parse_ptxas_info("", "main_kernel", &registers, &spills);
  EXPECT_EQ(registers, -1);
  EXPECT_EQ(spills, 0);
}

TEST(JitCompile, NvrtcVersionIsReported) {
  EXPECT_FALSE(jit::nvrtc_version().empty());
  EXPECT_NE(jit::nvrtc_library().find("nvrtc"), std::string::npos);
}

}  // namespace
}  // namespace flashport::test
