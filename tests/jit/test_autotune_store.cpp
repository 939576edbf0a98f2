// The autotune store (backends/cuda/autotune.hpp) without a GPU: entries surviving a "new process"
// (in-memory state dropped), damaged lines skipped, merges with entries another process wrote, the
// in-memory fallback of an unusable directory with one warning, and GPU names made file-safe.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "backends/cuda/autotune.hpp"
#include "flashport/error.hpp"
#include "jit/test_jit_util.hpp"

namespace flashport::test {
namespace {

namespace autotune = cuda::autotune;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

/// A fresh cache directory and an empty in-memory store on both ends; a GPU name and driver version
/// no other test uses, so leftovers cannot answer a lookup.
class AutotuneStore : public testing::Test {
 protected:
  void SetUp() override {
    autotune::reset_for_testing();
    std::random_device rd;
    gpu = "Test GPU/" + std::to_string(rd() % 100000) + " (x2)";
    driver = 12000 + static_cast<int>(rd() % 900);
  }
  void TearDown() override { autotune::reset_for_testing(); }
  std::string file() const { return cache.path() + "/" + autotune::file_name(gpu, driver); }

  ScopedCacheDir cache;
  std::string gpu;
  int driver = 0;
};

TEST_F(AutotuneStore, RoundTripAcrossProcesses) {
  const std::string key = "hopper_fwd d=128 causal=1 dtype=bf16";
  EXPECT_FALSE(autotune::lookup(gpu, driver, key));
  autotune::store(gpu, driver, key, "176:2:0");
  autotune::store(gpu, driver, "hopper_fwd d=64 causal=0 dtype=f16", "128:3:2");
  autotune::store(gpu, driver, key, "128:2:1");  // replaced, not appended
  EXPECT_EQ(autotune::lookup(gpu, driver, key), "128:2:1");
  EXPECT_EQ(autotune::file_path(gpu, driver), file());
  const std::string text = read_text(file());
  EXPECT_EQ(count_of(text, key), 1u) << text;
  EXPECT_EQ(cache.files().size(), 1u) << "temp files left behind";

  autotune::reset_for_testing();  // a new process: only the file remains
  EXPECT_EQ(autotune::lookup(gpu, driver, key), "128:2:1");
  EXPECT_EQ(autotune::lookup(gpu, driver, "hopper_fwd d=64 causal=0 dtype=f16"), "128:3:2");
  EXPECT_FALSE(autotune::lookup(gpu, driver, "hopper_fwd d=64 causal=1 dtype=f16"));
  // Another driver version or GPU is another file.
  EXPECT_FALSE(autotune::lookup(gpu, driver + 1, key));
  EXPECT_FALSE(autotune::lookup(gpu + "b", driver, key));
}

TEST_F(AutotuneStore, DamagedLinesAreSkipped) {
  std::filesystem::create_directories(cache.path());
  write_text(file(),
             "# a comment 1:2:3\n"
             "good key 64:2:0\n"
             "novalue\n"
             " leading-space 1:1:1\n"
             "trailing-space \n"
             "\x01\x02 binary 9:9:9\n"
             "\n"
             "dup 1:2:0\n"
             "dup 3:4:0\n"
             "partial last line 7:7:7");  // no newline: a foreign writer cut short
  EXPECT_EQ(autotune::lookup(gpu, driver, "good key"), "64:2:0");
  EXPECT_EQ(autotune::lookup(gpu, driver, "dup"), "3:4:0");  // the later line wins
  for (const char* key : {"novalue", "leading-space", " leading-space", "trailing-space", "binary",
                          "partial last line", "# a comment", ""}) {
    EXPECT_FALSE(autotune::lookup(gpu, driver, key)) << "'" << key << "'";
  }
  // A store rewrites the file with the valid entries only, and it parses back the same.
  autotune::store(gpu, driver, "new key", "112:2:0");
  autotune::reset_for_testing();
  EXPECT_EQ(autotune::lookup(gpu, driver, "good key"), "64:2:0");
  EXPECT_EQ(autotune::lookup(gpu, driver, "new key"), "112:2:0");
  EXPECT_EQ(read_text(file()).find("binary"), std::string::npos);
}

TEST_F(AutotuneStore, StoreMergesEntriesOfOtherProcesses) {
  autotune::store(gpu, driver, "mine", "1:2:3");
  // Another process stores meanwhile (after this one loaded the file).
  write_text(file(), read_text(file()) + "theirs 4:5:6\n");
  autotune::store(gpu, driver, "mine too", "7:8:9");
  autotune::reset_for_testing();
  EXPECT_EQ(autotune::lookup(gpu, driver, "mine"), "1:2:3");
  EXPECT_EQ(autotune::lookup(gpu, driver, "theirs"), "4:5:6");
  EXPECT_EQ(autotune::lookup(gpu, driver, "mine too"), "7:8:9");
}

TEST_F(AutotuneStore, RejectsKeysAndValuesThatCannotRoundTrip) {
  EXPECT_THROW(autotune::store(gpu, driver, "", "1:2:3"), Error);
  EXPECT_THROW(autotune::store(gpu, driver, "two\nlines", "1:2:3"), Error);
  EXPECT_THROW(autotune::store(gpu, driver, "key", ""), Error);
  EXPECT_THROW(autotune::store(gpu, driver, "key", "1 2"), Error);
  EXPECT_FALSE(autotune::lookup(gpu, driver, "key"));
}

TEST(AutotuneFileName, GpuNamesBecomeFileSafe) {
  EXPECT_EQ(autotune::file_name("NVIDIA H200", 13000), "autotune-NVIDIA_H200-drv13000.txt");
  EXPECT_EQ(autotune::file_name("GRID A100/40C (vGPU)", 12080), "autotune-GRID_A100_40C__vGPU_-drv12080.txt");
  EXPECT_EQ(autotune::file_name("NVIDIA A100-SXM4-80GB", 12040),
            "autotune-NVIDIA_A100-SXM4-80GB-drv12040.txt");
  EXPECT_EQ(autotune::file_name("../..", 1), "autotune-.._..-drv1.txt");  // no path separator survives
  EXPECT_EQ(autotune::file_name("", 13000), "autotune-unknown-drv13000.txt");
  // Distinct drivers never share a file.
  EXPECT_NE(autotune::file_name("NVIDIA H200", 13000), autotune::file_name("NVIDIA H200", 12080));
}

TEST(AutotuneStoreFallback, UncreatableDirKeepsEntriesInMemoryWithOneWarning) {
  autotune::reset_for_testing();
  // Under a regular file the directory cannot be created, even as root.
  char templ[] = "/tmp/flashport-autotune-test-XXXXXX";
  ASSERT_NE(mkdtemp(templ), nullptr);
  const std::string root = templ;
  write_text(root + "/file", "x");
  ScopedCacheDir cache(root, root + "/file/sub");
  testing::internal::CaptureStderr();
  autotune::store("GPU", 1, "a", "1:2:0");
  autotune::store("GPU", 1, "b", "3:4:0");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(autotune::lookup("GPU", 1, "a"), "1:2:0");
  EXPECT_EQ(autotune::lookup("GPU", 1, "b"), "3:4:0");
  EXPECT_EQ(autotune::file_path("GPU", 1), "");
  EXPECT_EQ(count_of(err, "autotune results are kept in memory only"), 1u) << err;
  autotune::reset_for_testing();
  EXPECT_FALSE(autotune::lookup("GPU", 1, "a"));  // nothing reached a disk
}

TEST(AutotuneStoreFallback, ReadOnlyDirServesEntriesAndWarnsOnce) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  autotune::reset_for_testing();
  ScopedCacheDir cache;
  autotune::store("GPU", 2, "shared", "64:2:0");  // e.g. filled ahead of time, then made read-only
  autotune::reset_for_testing();
  ASSERT_EQ(chmod(cache.path().c_str(), 0555), 0);
  testing::internal::CaptureStderr();
  const auto shared = autotune::lookup("GPU", 2, "shared");
  autotune::store("GPU", 2, "local", "128:2:0");
  autotune::store("GPU", 2, "local2", "128:3:0");
  const std::string err = testing::internal::GetCapturedStderr();
  chmod(cache.path().c_str(), 0755);
  EXPECT_EQ(shared, "64:2:0");
  EXPECT_EQ(autotune::lookup("GPU", 2, "local"), "128:2:0");  // kept in memory
  EXPECT_EQ(count_of(err, "autotune results are kept in memory only"), 1u) << err;
  EXPECT_EQ(count_of(read_text(cache.path() + "/" + autotune::file_name("GPU", 2)), "local"), 0u);
  autotune::reset_for_testing();
}

}  // namespace
}  // namespace flashport::test
