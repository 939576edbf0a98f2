// Helpers for the JIT tests: a private cache directory per test and the selftest kernel's spec.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "jit/jit.hpp"

namespace flashport::test {

/// Points FLASHPORT_CACHE_DIR at a fresh temporary directory (or at `path` when given) for the
/// test's lifetime, and clears the in-process compile results on both ends.
class ScopedCacheDir {
 public:
  ScopedCacheDir() {
    char templ[] = "/tmp/flashport-jit-test-XXXXXX";
    root_ = mkdtemp(templ) ? templ : "";
    EXPECT_FALSE(root_.empty());
    path_ = root_ + "/cache";
    activate();
  }
  /// Cache path chosen by the test; `root` is removed afterwards.
  ScopedCacheDir(std::string root, std::string path) : root_(std::move(root)), path_(std::move(path)) {
    activate();
  }
  ~ScopedCacheDir() {
    if (had_old_) {
      setenv("FLASHPORT_CACHE_DIR", old_.c_str(), 1);
    } else {
      unsetenv("FLASHPORT_CACHE_DIR");
    }
    jit::drop_memory_cache();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  const std::string& path() const { return path_; }
  const std::string& root() const { return root_; }

  /// Regular files in the cache directory, less hidden ones (the prune lock).
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path_, ec)) {
      std::string name = e.path().filename().string();
      if (e.is_regular_file() && name[0] != '.') out.push_back(std::move(name));
    }
    return out;
  }

 private:
  void activate() {
    if (const char* old = std::getenv("FLASHPORT_CACHE_DIR")) {
      had_old_ = true;
      old_ = old;
    }
    setenv("FLASHPORT_CACHE_DIR", path_.c_str(), 1);
    jit::drop_memory_cache();
  }
  std::string root_, path_, old_;
  bool had_old_ = false;
};

/// The selftest kernel (src/kernels/cuda/jit_selftest.cu) for `arch` with extra defines.
inline jit::KernelSpec selftest_spec(int arch,
                                     std::vector<std::pair<std::string, std::string>> defines = {}) {
  return jit::KernelSpec{"cuda/jit_selftest.cu", "flashport_jit_selftest", std::move(defines), arch};
}

inline bool is_elf(const std::vector<char>& bytes) {
  return bytes.size() > 64 && std::memcmp(bytes.data(),
                                          "\x7f"
                                          "ELF",
                                          4) == 0;
}

/// Occurrences of `needle` in `text` (warnings printed once, ...).
inline size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

}  // namespace flashport::test
