// Pruning of the kernel cache: least-recently-used order, the entry just written kept, a cap of 0
// meaning unlimited, stale temp files removed, FLASHPORT_CACHE_MAX_MB validated, recency refreshed by
// disk hits, and readers in other threads and processes seeing only valid hits or misses while
// entries are pruned under them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include "flashport/error.hpp"
#include "jit/detail.hpp"
#include "jit/test_jit_util.hpp"

namespace flashport::test {
namespace {

constexpr uint64_t kKiB = 1024;

/// Sets `path`'s mtime to `age_seconds` ago.
void set_age(const std::string& path, int age_seconds) {
  timespec times[2];
  clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= age_seconds;
  times[1] = times[0];
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

void write_bytes(const std::string& path, uint64_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << std::string(bytes, 'x');
}

/// A file with an entry's name (pruning goes by names and sizes, not contents), `age_seconds` old.
std::string make_entry(const std::string& dir, int id, uint64_t bytes, int age_seconds) {
  const std::string path =
      dir + "/" + jit::detail::entry_file_name("fake_kernel_" + std::to_string(id), 80, id);
  write_bytes(path, bytes);
  set_age(path, age_seconds);
  return path;
}

std::string name_of(const std::string& path) {
  return path.substr(path.rfind('/') + 1);
}

std::set<std::string> file_set(const ScopedCacheDir& cache) {
  const auto files = cache.files();
  return {files.begin(), files.end()};
}

/// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(CachePrune, EntryNamesAreRecognised) {
  EXPECT_TRUE(jit::detail::is_entry_file_name(jit::detail::entry_file_name("attn_fwd<128>", 90, 0xabc)));
  for (const char* name :
       {"notes.cubin", "x-sm80-0123456789abcdef.cubin.tmp.1.2.3", "x-sm80-0123.cubin",
        "x-sm-0123456789abcdef.cubin", "x-smA0-0123456789abcdef.cubin", "x-sm80-0123456789ABCDEF.cubin",
        "a b-sm80-0123456789abcdef.cubin", ".prune.lock"}) {
    EXPECT_FALSE(jit::detail::is_entry_file_name(name)) << name;
  }
}

TEST(CachePrune, RemovesLeastRecentlyUsedFirst) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  // Ages out of step with the names, so that an order by name would remove other entries.
  const int ages[10] = {7, 2, 9, 0, 5, 3, 8, 1, 6, 4};
  std::vector<std::string> by_age(10);
  for (int id = 0; id < 10; ++id)
    by_age[ages[id]] = make_entry(cache.path(), id, 100 * kKiB, 600 + 60 * ages[id]);
  // Old files the cache does not own stay, whatever the pressure.
  for (const char* other : {"notes.txt", "autotune-GPU-drv12080.txt"}) {
    write_bytes(cache.path() + "/" + other, 500 * kKiB);
    set_age(cache.path() + "/" + other, 100000);
  }

  std::vector<std::string> reported;
  const auto stats = jit::prune_cache(cache.path(), 600 * kKiB, {},
                                      [&](const std::string& path, uint64_t) { reported.push_back(path); });
  // 1000 KiB > the 600 KiB cap: down to at most 540 KiB, i.e. the five most recently used.
  EXPECT_EQ(stats.error, "");
  EXPECT_FALSE(stats.skipped);
  EXPECT_EQ(stats.removed, 5u);
  EXPECT_EQ(stats.removed_bytes, 500 * kKiB);
  EXPECT_EQ(stats.remaining, 5u);
  EXPECT_EQ(stats.remaining_bytes, 500 * kKiB);
  const std::vector<std::string> oldest_first(by_age.rbegin(), by_age.rbegin() + 5);
  EXPECT_EQ(reported, oldest_first);
  std::set<std::string> expected = {"notes.txt", "autotune-GPU-drv12080.txt"};
  for (int age = 0; age < 5; ++age) expected.insert(name_of(by_age[age]));
  EXPECT_EQ(file_set(cache), expected);

  const auto again = jit::prune_cache(cache.path(), 600 * kKiB);
  EXPECT_EQ(again.removed, 0u);  // under the cap now
  EXPECT_EQ(again.remaining, 5u);
}

TEST(CachePrune, AtTheCapNothingIsRemoved) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  for (int id = 0; id < 4; ++id) make_entry(cache.path(), id, 100 * kKiB, 1000 * (id + 1));
  const auto stats = jit::prune_cache(cache.path(), 400 * kKiB);
  EXPECT_EQ(stats.removed, 0u);
  EXPECT_EQ(stats.remaining, 4u);
  EXPECT_EQ(jit::prune_cache(cache.path(), 400 * kKiB - 1).removed, 1u);
}

TEST(CachePrune, EntryJustWrittenSurvives) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  std::vector<std::string> paths;
  for (int id = 0; id < 4; ++id) paths.push_back(make_entry(cache.path(), id, 100 * kKiB, 1000 * (id + 1)));
  // The oldest, and alone larger than the cap: everything else goes, it stays.
  const std::string keep = make_entry(cache.path(), 99, 300 * kKiB, 100000);
  const auto stats = jit::prune_cache(cache.path(), 200 * kKiB, keep);
  EXPECT_EQ(stats.removed, 4u);
  EXPECT_EQ(stats.remaining, 1u);
  EXPECT_EQ(stats.remaining_bytes, 300 * kKiB);
  EXPECT_TRUE(std::filesystem::exists(keep));
  for (const auto& path : paths) EXPECT_FALSE(std::filesystem::exists(path)) << path;
}

TEST(CachePrune, ZeroCapIsUnlimited) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  for (int id = 0; id < 5; ++id) make_entry(cache.path(), id, 400 * kKiB, 100000 + id);
  const auto stats = jit::prune_cache(cache.path(), 0);
  EXPECT_EQ(stats.removed, 0u);
  EXPECT_EQ(stats.remaining, 5u);

  // Through the variable and the write path: 2 MB of old entries stay past a new write.
  ScopedEnv cap("FLASHPORT_CACHE_MAX_MB", "0");
  EXPECT_EQ(jit::cache_max_bytes(), 0u);
  const auto result = jit::compile(selftest_spec(80, {{"SELFTEST_SCALE", "11.0f"}}));
  EXPECT_TRUE(is_elf(result.cubin));
  EXPECT_EQ(cache.files().size(), 5u + 1u);  // + the new entry
}

TEST(CachePrune, StaleTempFilesAreRemoved) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  const std::string entry = jit::detail::entry_file_name("k", 80, 1);
  const std::string stale_entry_temp = entry + ".tmp.4242.17.0",
                    stale_autotune_temp = "autotune-H200-drv13000.txt.tmp.4242.0",
                    fresh_temp = entry + ".tmp.4243.17.1", foreign_temp = "download.tmp.1";
  for (const auto& name : {stale_entry_temp, stale_autotune_temp, fresh_temp, foreign_temp}) {
    write_bytes(cache.path() + "/" + name, 10 * kKiB);
  }
  set_age(cache.path() + "/" + stale_entry_temp, 3600);
  set_age(cache.path() + "/" + stale_autotune_temp, 3600);
  set_age(cache.path() + "/" + fresh_temp, 60);  // a writer between compile and rename
  set_age(cache.path() + "/" + foreign_temp, 3600);

  const auto stats = jit::prune_cache(cache.path(), 0);  // unlimited still cleans up
  EXPECT_EQ(stats.temps_removed, 2u);
  EXPECT_EQ(stats.remaining, 0u);  // temp files are not entries
  EXPECT_EQ(file_set(cache), (std::set<std::string>{fresh_temp, foreign_temp}));
}

TEST(CachePrune, CapVariableIsValidated) {
  EXPECT_EQ(jit::parse_cache_max_mb("0", "X"), 0u);
  EXPECT_EQ(jit::parse_cache_max_mb("2048", "X"), 2048u);
  for (const char* bad :
       {"", "-1", "1.5", " 12", "12 ", "12MB", "+3", "99999999999999999999", "17592186044416"}) {
    try {
      jit::parse_cache_max_mb(bad, "--max-mb");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "--max-mb");
      EXPECT_NE(std::string(e.what()).find(std::string("'") + bad + "'"), std::string::npos) << e.what();
    }
  }

  ScopedEnv unset("FLASHPORT_CACHE_MAX_MB", "");
  EXPECT_EQ(jit::cache_max_bytes(), jit::kDefaultCacheMaxMb << 20);
  ScopedEnv set("FLASHPORT_CACHE_MAX_MB", "300");
  EXPECT_EQ(jit::cache_max_bytes(), 300u << 20);
  ScopedEnv bad("FLASHPORT_CACHE_MAX_MB", "2GB");
  testing::internal::CaptureStderr();
  const uint64_t first = jit::cache_max_bytes(), second = jit::cache_max_bytes();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(first, jit::kDefaultCacheMaxMb << 20);
  EXPECT_EQ(second, first);
  EXPECT_EQ(count_of(err, "warning"), 1u) << err;
  EXPECT_NE(err.find("FLASHPORT_CACHE_MAX_MB"), std::string::npos) << err;
  EXPECT_NE(err.find("'2GB'"), std::string::npos) << err;
}

TEST(CachePrune, DiskHitRefreshesRecencyAndWritesPrune) {
  ScopedCacheDir cache;
  ScopedEnv cap("FLASHPORT_CACHE_MAX_MB", "1");
  const auto used = selftest_spec(80, {{"SELFTEST_SCALE", "12.0f"}});
  const auto fresh = selftest_spec(80, {{"SELFTEST_SCALE", "13.0f"}});
  jit::compile(used);
  const std::string used_file = jit::cache_file(used);
  set_age(used_file, 2 * 86400);
  // Three entries younger than `used`; with them the cache passes 1 MB at the next write.
  std::vector<std::string> fakes;
  for (int id = 0; id < 3; ++id) fakes.push_back(make_entry(cache.path(), id, 350 * kKiB, 86400 + 3600 * id));

  jit::drop_memory_cache();
  EXPECT_TRUE(jit::compile(used).from_cache);  // a disk hit: now the most recently used
  struct stat st;
  ASSERT_EQ(stat(used_file.c_str(), &st), 0);
  EXPECT_LT(std::abs(time(nullptr) - st.st_mtim.tv_sec), 60);

  EXPECT_FALSE(jit::compile(fresh).from_cache);  // a write: pruned down to 90% of 1 MB
  EXPECT_TRUE(std::filesystem::exists(jit::cache_file(fresh)));
  EXPECT_TRUE(std::filesystem::exists(used_file));
  EXPECT_FALSE(std::filesystem::exists(fakes[2]));  // the oldest
  EXPECT_TRUE(std::filesystem::exists(fakes[1]));
  EXPECT_TRUE(std::filesystem::exists(fakes[0]));
}

TEST(CachePrune, ClearRemovesEveryEntryOnly) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  for (int id = 0; id < 3; ++id) make_entry(cache.path(), id, kKiB, id);
  write_bytes(cache.path() + "/autotune-GPU-drv12080.txt", 100);
  const auto stats = jit::clear_cache(cache.path());
  EXPECT_EQ(stats.removed, 3u);
  EXPECT_EQ(stats.remaining, 0u);
  EXPECT_EQ(file_set(cache), (std::set<std::string>{"autotune-GPU-drv12080.txt"}));
}

// --- concurrent readers --------------------------------------------------------------------------

/// Real entries (header, key, checksum) with distinct 64 KiB payloads, written through the disk
/// cache's own functions, so that every read can be checked byte for byte.
struct Workload {
  static constexpr int kEntries = 24;
  static constexpr uint64_t kCap = 8 * 64 * kKiB;  // a third of the entries fit
  std::string dir;

  std::string path(int i) const { return dir + "/" + jit::detail::entry_file_name("load", 80, 1000 + i); }
  static std::string key(int i) { return "prune workload entry " + std::to_string(i) + "\n"; }
  static jit::CompileResult result(int i) {
    jit::CompileResult r;
    r.cubin.assign(64 * kKiB, static_cast<char>('a' + i % 26));
    std::memcpy(r.cubin.data(),
                "\x7f"
                "ELF",
                4);
    r.log = "log of " + std::to_string(i);
    r.registers = i;
    return r;
  }
  void write(int i) const {
    std::string error;
    EXPECT_TRUE(jit::detail::write_cache_entry(path(i), key(i), result(i), &error)) << error;
  }
  /// True for a hit with exactly the written bytes, false for a miss; a wrong entry fails the test.
  bool read(int i) const {
    const auto got = jit::detail::read_cache_entry(path(i), key(i));
    if (!got) return false;
    const auto want = result(i);
    EXPECT_TRUE(got->cubin == want.cubin && got->log == want.log && got->registers == want.registers) << i;
    return true;
  }
  /// Writes and prunes in turns until `stop`; false when a pass reported an error.
  bool churn(const std::atomic<bool>& stop, int seed) const {
    for (int round = 0; !stop; ++round) {
      write((seed + round * 7) % kEntries);
      const auto stats = jit::prune_cache(dir, kCap);
      if (!stats.error.empty()) {
        ADD_FAILURE() << stats.error;
        return false;
      }
    }
    return true;
  }
};

/// Reads every entry in turn `rounds` times; returns {hits, misses}, with stderr checked for damage.
std::pair<int, int> read_while_pruned(const Workload& load, int rounds) {
  int hits = 0, misses = 0;
  testing::internal::CaptureStderr();
  for (int round = 0; round < rounds; ++round) {
    for (int i = 0; i < Workload::kEntries; ++i) (load.read(i) ? hits : misses) += 1;
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_of(err, "damaged"), 0u) << err;
  return {hits, misses};
}

TEST(CachePrune, ReadersInThreadsSeeHitsOrMisses) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  const Workload load{cache.path()};
  for (int i = 0; i < Workload::kEntries; ++i) load.write(i);
  std::atomic<bool> stop{false};
  std::vector<std::thread> pruners;
  for (int t = 0; t < 2; ++t) pruners.emplace_back([&, t] { load.churn(stop, t); });
  const auto [hits, misses] = read_while_pruned(load, 200);
  stop = true;
  for (auto& thread : pruners) thread.join();
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 0);  // the pruners did remove entries under the reader
  EXPECT_LE(jit::prune_cache(cache.path(), Workload::kCap).remaining_bytes, Workload::kCap);
}

// Runs only as a child of ReadersInProcessesSeeHitsOrMisses (skipped otherwise).
TEST(CachePruneChild, WriteAndPrune) {
  const char* dir = std::getenv("FLASHPORT_PRUNE_TEST_CHILD");
  if (!dir) GTEST_SKIP() << "child of a multi-process test";
  const Workload load{dir};
  std::atomic<bool> stop{false};
  std::thread timer([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    stop = true;
  });
  EXPECT_TRUE(load.churn(stop, getpid()));
  timer.join();
}

TEST(CachePrune, ReadersInProcessesSeeHitsOrMisses) {
  ScopedCacheDir cache;
  std::filesystem::create_directories(cache.path());
  const Workload load{cache.path()};
  for (int i = 0; i < Workload::kEntries; ++i) load.write(i);
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  const std::string child = "FLASHPORT_PRUNE_TEST_CHILD='" + cache.path() + "' '" + std::string(exe, n) +
                            "' --gtest_filter=CachePruneChild.WriteAndPrune >/dev/null 2>&1";
  const std::string command = "(" + child + " & a=$!; " + child + " & b=$!; wait $a && wait $b; echo $? > '" +
                              cache.root() + "/rc.tmp'; mv '" + cache.root() + "/rc.tmp' '" + cache.root() +
                              "/rc') >/dev/null 2>&1 &";
  ASSERT_EQ(std::system(command.c_str()), 0);
  int hits = 0, misses = 0;
  while (!std::filesystem::exists(cache.root() + "/rc")) {
    const auto [h, m] = read_while_pruned(load, 5);
    hits += h;
    misses += m;
  }
  std::ifstream rc(cache.root() + "/rc");
  int status = -1;
  rc >> status;
  EXPECT_EQ(status, 0) << "a pruning child failed";
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 0);
}

}  // namespace
}  // namespace flashport::test
