// flashport-prebuild: compiles every CUDA kernel variant the dispatcher can pick into the disk
// cache, so first use of flashport does not wait for NVRTC; prunes or clears that cache on request.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "flashport/error.hpp"
#include "jit/jit.hpp"
#if __has_include("backends/cuda/variants.hpp")
#include "backends/cuda/variants.hpp"
#define FLASHPORT_HAVE_VARIANTS 1
#endif

namespace {

using flashport::jit::KernelSpec;

void usage() {
  std::printf(
      "usage: flashport-prebuild [--arch 80,90] [-j N] [--list] [--dump DIR] [--only TEXT]\n"
      "       flashport-prebuild --prune [--max-mb N] | --clear\n"
      "  --arch    compute capabilities to build for (default: the local GPUs', else 80,90)\n"
      "  -j        parallel compiles (default: hardware threads)\n"
      "  --list    print the kernels without compiling\n"
      "  --only    only the kernels whose key contains TEXT (repeatable: any of them)\n"
      "  --dump    also write each cubin to DIR/<key>.cubin (scripts/sass_snapshot.sh diffs their SASS)\n"
      "  --prune   remove the least recently used kernels until the cache is within 90%% of its cap\n"
      "  --max-mb  the cap for --prune (default: $FLASHPORT_CACHE_MAX_MB, else %llu; 0 = unlimited)\n"
      "  --clear   remove every cached kernel (autotune results are kept)\n"
      "The cache is $FLASHPORT_CACHE_DIR, else ~/.cache/flashport.\n",
      static_cast<unsigned long long>(flashport::jit::kDefaultCacheMaxMb));
}

double megabytes(uint64_t bytes) {
  return static_cast<double>(bytes) / (1 << 20);
}

/// --prune / --clear: one pass over the cache, each removed entry printed as it goes.
int prune(bool clear, std::optional<uint64_t> max_mb) {
  const std::string dir = flashport::jit::cache_dir();
  if (dir.empty()) {
    std::fprintf(stderr, "flashport-prebuild: no writable kernel cache directory to prune\n");
    return 1;
  }
  const uint64_t max_bytes = max_mb ? *max_mb << 20 : flashport::jit::cache_max_bytes();
  if (clear) {
    std::printf("flashport-prebuild: clearing cache %s\n", dir.c_str());
  } else if (max_bytes == 0) {
    std::printf("flashport-prebuild: cache %s has no cap (0 = unlimited): removing stale temp files only\n",
                dir.c_str());
  } else {
    std::printf("flashport-prebuild: pruning cache %s to %.1f MB (cap %.0f MB)\n", dir.c_str(),
                megabytes(max_bytes - max_bytes / 10), megabytes(max_bytes));
  }
  std::fflush(stdout);
  size_t count = 0;
  uint64_t bytes = 0;
  auto report = [&](const std::string& path, uint64_t size) {
    bytes += size;
    std::printf("[%zu] removed %-70s %8.2f MB (%.1f MB so far)\n", ++count,
                path.substr(path.rfind('/') + 1).c_str(), megabytes(size), megabytes(bytes));
    std::fflush(stdout);
  };
  const auto stats = clear ? flashport::jit::clear_cache(dir, report)
                           : flashport::jit::prune_cache(dir, max_bytes, {}, report);
  if (!stats.error.empty()) {
    std::fprintf(stderr, "flashport-prebuild: %s\n", stats.error.c_str());
    return 1;
  }
  if (stats.skipped) {
    std::fprintf(stderr, "flashport-prebuild: another process is pruning %s now; nothing done\n",
                 dir.c_str());
    return 1;
  }
  std::printf(
      "flashport-prebuild: removed %zu kernels (%.1f MB) and %zu stale temp files; %zu kernels (%.1f MB) "
      "remain\n",
      stats.removed, megabytes(stats.removed_bytes), stats.temps_removed, stats.remaining,
      megabytes(stats.remaining_bytes));
  return 0;
}

/// A file name for spec's key: characters other than [A-Za-z0-9._=,-] become '_'.
std::string dump_name(const KernelSpec& spec) {
  std::string name = spec.key();
  for (char& ch : name) {
    const bool keep = std::isalnum(static_cast<unsigned char>(ch)) || std::strchr("._=,-", ch) != nullptr;
    if (!keep) ch = '_';
  }
  return name + ".cubin";
}

void dump_cubin(const std::string& dir, const KernelSpec& spec, const std::vector<char>& cubin) {
  const std::string path = dir + "/" + dump_name(spec);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  const bool ok = f && std::fwrite(cubin.data(), 1, cubin.size(), f) == cubin.size();
  if (f) std::fclose(f);
  if (!ok) throw std::runtime_error("cannot write " + path);
}

std::vector<int> parse_archs(const char* text) {
  std::vector<int> archs;
  for (const char* p = text; *p;) {
    char* end = nullptr;
    const long arch = std::strtol(p, &end, 10);
    if (end == p || arch < 50) throw std::runtime_error(std::string("bad --arch list: ") + text);
    archs.push_back(static_cast<int>(arch));
    p = *end == ',' ? end + 1 : end;
  }
  return archs;
}

std::vector<int> default_archs() {
  std::set<int> archs;
  for (int device = 0; device < flashport::jit::device_count(); ++device) {
    archs.insert(flashport::jit::device_arch(device));
  }
  if (archs.empty()) return {80, 90};
  return {archs.begin(), archs.end()};
}

std::vector<KernelSpec> variants_for(int arch) {
#ifdef FLASHPORT_HAVE_VARIANTS
  return flashport::cuda::all_variants(arch);
#else
  return {KernelSpec{"cuda/jit_selftest.cu", "flashport_jit_selftest", {}, arch}};
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> archs;
  unsigned jobs = std::max(1u, std::thread::hardware_concurrency());
  bool list_only = false, prune_only = false, clear = false;
  std::string dump_dir;
  std::vector<std::string> only;
  std::optional<uint64_t> max_mb;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--arch" && i + 1 < argc) {
        archs = parse_archs(argv[++i]);
      } else if (arg == "-j" && i + 1 < argc) {
        jobs = static_cast<unsigned>(std::max(1, std::atoi(argv[++i])));
      } else if (arg == "--only" && i + 1 < argc) {
        only.push_back(argv[++i]);
      } else if (arg == "--dump" && i + 1 < argc) {
        dump_dir = argv[++i];
      } else if (arg == "--list") {
        list_only = true;
      } else if (arg == "--prune") {
        prune_only = true;
      } else if (arg == "--clear") {
        clear = true;
      } else if (arg == "--max-mb" && i + 1 < argc) {
        max_mb = flashport::jit::parse_cache_max_mb(argv[++i], "--max-mb");
      } else {
        usage();
        return arg == "-h" || arg == "--help" ? 0 : 2;
      }
    }
    if (prune_only && clear) throw std::runtime_error("--prune and --clear exclude each other");
    if (max_mb && !prune_only) throw std::runtime_error("--max-mb applies to --prune only");
    if (prune_only || clear) return prune(clear, max_mb);
    if (archs.empty()) archs = default_archs();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashport-prebuild: %s\n", e.what());
    return 2;
  }

  std::vector<KernelSpec> specs;
  for (int arch : archs) {
    auto more = variants_for(arch);
    for (auto& spec : more) {
      const std::string key = spec.key();
      const bool wanted = only.empty() || std::any_of(only.begin(), only.end(), [&](const std::string& text) {
                            return key.find(text) != std::string::npos;
                          });
      if (wanted) specs.push_back(std::move(spec));
    }
  }
  if (list_only) {
    for (const auto& spec : specs) std::printf("%s\n", spec.key().c_str());
    return 0;
  }
  const std::string dir = flashport::jit::cache_dir();
  std::printf("flashport-prebuild: %zu kernels, %u parallel, cache %s\n", specs.size(), jobs,
              dir.empty() ? "(memory only: nothing will persist)" : dir.c_str());
  std::fflush(stdout);

  std::atomic<size_t> next{0};
  std::mutex print_mutex;
  size_t done = 0, cached = 0;
  std::vector<std::string> failures, spilling;
  int max_registers = 0;
  const auto start = std::chrono::steady_clock::now();
  auto worker = [&] {
    for (size_t i; (i = next++) < specs.size();) {
      const KernelSpec& spec = specs[i];
      try {
        const auto result = flashport::jit::compile(spec);
        if (!dump_dir.empty()) dump_cubin(dump_dir, spec, result.cubin);
        std::lock_guard lock(print_mutex);
        ++done;
        cached += result.from_cache;
        max_registers = std::max(max_registers, result.registers);
        if (result.spill_bytes > 0) spilling.push_back(spec.key());
        std::printf("[%zu/%zu] %-70s %6.1f s %4d regs %5d B spill%s\n", done, specs.size(),
                    spec.key().c_str(), result.seconds, result.registers, result.spill_bytes,
                    result.from_cache ? " (cached)" : "");
        std::fflush(stdout);
      } catch (const std::exception& e) {
        std::lock_guard lock(print_mutex);
        ++done;
        failures.push_back(spec.key());
        std::printf("[%zu/%zu] %s FAILED\n%s\n", done, specs.size(), spec.key().c_str(), e.what());
        std::fflush(stdout);
      }
    }
  };
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < std::min<size_t>(jobs, specs.size()); ++t) threads.emplace_back(worker);
  for (auto& thread : threads) thread.join();

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "flashport-prebuild: %zu kernels in %.1f s: %zu compiled, %zu already cached, %zu failed; "
      "max %d registers; %zu spill\n",
      specs.size(), seconds, specs.size() - cached - failures.size(), cached, failures.size(), max_registers,
      spilling.size());
  for (const auto& key : spilling) std::printf("  spills: %s\n", key.c_str());
  for (const auto& key : failures) std::printf("  failed: %s\n", key.c_str());
  return failures.empty() ? 0 : 1;
}
