// NVRTC compilation of the embedded kernels (libnvrtc opened with dlopen), the cache key, the
// in-process once-per-kernel table and the disk-cache lookups around it.
#include <dlfcn.h>
#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "jit/detail.hpp"

namespace flashport::jit {
namespace {

/// The NVRTC entry points this file uses, resolved from whichever libnvrtc loads first.
struct Nvrtc {
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcGetErrorString) error_string = nullptr;
  decltype(&::nvrtcCreateProgram) create_program = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy_program = nullptr;
  decltype(&::nvrtcCompileProgram) compile_program = nullptr;
  decltype(&::nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) get_log = nullptr;
  decltype(&::nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) get_cubin = nullptr;
  std::string library, version_text, load_error;
};

/// Candidate libnvrtc files: an explicit override, then per major version (the one the driver
/// supports first) the loader's search path, the toolkit, and a pip-installed nvidia-cuda-nvrtc
/// next to the binary holding this code (the Python extension lives in site-packages/flashport/).
std::vector<std::string> nvrtc_candidates() {
  std::vector<std::string> out;
  const core::Tuning& tuning = core::tuning();
  if (const std::string& path = tuning.nvrtc_path.get(); !path.empty()) out.push_back(path);
  std::vector<std::string> dirs = {""};  // "": the dynamic loader's own search
  for (const std::string* root : {&tuning.cuda_home, &tuning.cuda_path}) {
    if (!root->empty()) dirs.push_back(*root + "/lib64/");
  }
  dirs.emplace_back("/usr/local/cuda/lib64/");
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nvrtc_candidates), &info) && info.dli_fname) {
    std::string base = info.dli_fname;
    for (int up = 0; up < 3; ++up) {
      const size_t slash = base.rfind('/');
      if (slash == std::string::npos) break;
      base.resize(slash);
      dirs.push_back(base + "/nvidia/cu13/lib/");
      dirs.push_back(base + "/nvidia/cuda_nvrtc/lib/");
    }
  }
  // A CUDA 12 driver cannot load cubins from NVRTC 13.
  const int driver = detail::driver_cuda_version();
  const bool prefer_12 = driver >= 12000 && driver < 13000;
  for (const char* name : {prefer_12 ? "libnvrtc.so.12" : "libnvrtc.so.13",
                           prefer_12 ? "libnvrtc.so.13" : "libnvrtc.so.12", "libnvrtc.so"}) {
    for (const auto& dir : dirs) out.push_back(dir + name);
  }
  return out;
}

const Nvrtc& nvrtc() {
  static const Nvrtc api = [] {
    Nvrtc a;
    void* handle = nullptr;
    for (const auto& candidate : nvrtc_candidates()) {
      if ((handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL))) {
        a.library = candidate;
        break;
      }
    }
    if (!handle) {
      a.load_error =
          "libnvrtc (CUDA 12 or 13) not found: install the CUDA toolkit or nvidia-cuda-nvrtc, "
          "or set FLASHPORT_NVRTC_PATH";
      return a;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
      if (!fn && a.load_error.empty()) a.load_error = a.library + " lacks " + name;
    };
    sym(a.version, "nvrtcVersion");
    sym(a.error_string, "nvrtcGetErrorString");
    sym(a.create_program, "nvrtcCreateProgram");
    sym(a.destroy_program, "nvrtcDestroyProgram");
    sym(a.compile_program, "nvrtcCompileProgram");
    sym(a.log_size, "nvrtcGetProgramLogSize");
    sym(a.get_log, "nvrtcGetProgramLog");
    sym(a.cubin_size, "nvrtcGetCUBINSize");
    sym(a.get_cubin, "nvrtcGetCUBIN");
    if (a.load_error.empty()) {
      int major = 0, minor = 0;
      a.version(&major, &minor);
      a.version_text = std::to_string(major) + "." + std::to_string(minor);
    }
    return a;
  }();
  if (!api.load_error.empty()) throw Error("nvrtc", api.load_error);
  return api;
}

/// The NVRTC command line for `spec`. Arch 90 targets sm_90a (wgmma, setmaxnreg); the
/// arch-specific suffix is not portable to later GPUs, so other archs stay plain.
std::vector<std::string> nvrtc_options(const KernelSpec& spec) {
  std::vector<std::string> options = {
      "--gpu-architecture=sm_" + std::to_string(spec.arch) + (spec.arch == 90 ? "a" : ""),
      "-std=c++17",
      "--ptxas-options=-v",
      "-DFLASHPORT_JIT=1",
  };
  for (const auto& [name, value] : spec.defines) {
    options.push_back("-D" + name + (value.empty() ? "" : "=" + value));
  }
  // FLASHPORT_JIT_DEFINES (timing ablations such as FP_BWD_ABLATE): part of the options, so of the cache key.
  for (const std::string& define : core::tuning().jit_defines.get()) options.push_back("-D" + define);
  return options;
}

/// The cache identity of `spec`: every input that changes the cubin.
struct CacheKey {
  std::string text;
  uint64_t hash;
};

CacheKey cache_key(const KernelSpec& spec) {
  std::string text = "flashport-jit 1\nnvrtc " + nvrtc().version_text + "\nsources " +
                     detail::hex64(detail::sources().hash) + "\nsource " + spec.source + "\nentry " +
                     spec.entry + "\noptions";
  for (const auto& option : nvrtc_options(spec)) text += " " + option;
  text += "\n";
  return {text, detail::fnv1a(text)};
}

std::string entry_path(const std::string& dir, const KernelSpec& spec, const CacheKey& key) {
  return dir + "/" + detail::entry_file_name(spec.entry, spec.arch, key.hash);
}

bool verbose() {
  return core::tuning().jit_verbose.get();
}

std::atomic<size_t> g_compile_count{0};

CompileResult compile_with_nvrtc(const KernelSpec& spec) {
  const Nvrtc& api = nvrtc();
  const auto& table = detail::sources();
  const std::string kernel = "kernel " + spec.key();
  const auto it = table.index.find(spec.source);
  if (it == table.index.end()) {
    throw Error(kernel,
                "no embedded kernel source '" + spec.source + "' (paths are relative to src/kernels/)");
  }
  if (verbose()) std::fprintf(stderr, "flashport: compiling %s ...\n", spec.key().c_str());
  const auto start = std::chrono::steady_clock::now();

  nvrtcProgram program = nullptr;
  nvrtcResult rc = api.create_program(&program, table.texts[it->second].c_str(), spec.source.c_str(),
                                      static_cast<int>(table.names.size()), table.text_ptrs.data(),
                                      table.name_ptrs.data());
  if (rc != NVRTC_SUCCESS) throw Error(kernel, std::string("nvrtcCreateProgram: ") + api.error_string(rc));
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(
      &program, [](nvrtcProgram* p) { nvrtc().destroy_program(p); });

  const auto options = nvrtc_options(spec);
  std::vector<const char*> option_ptrs;
  for (const auto& option : options) option_ptrs.push_back(option.c_str());
  rc = api.compile_program(program, static_cast<int>(option_ptrs.size()), option_ptrs.data());

  CompileResult result;
  size_t log_size = 0;
  if (api.log_size(program, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    result.log.resize(log_size);
    api.get_log(program, result.log.data());
    result.log.resize(log_size - 1);  // drop the terminating NUL
  }
  if (rc != NVRTC_SUCCESS) {
    std::string command;
    for (const auto& option : options) command += " " + option;
    throw Error(kernel, std::string("NVRTC ") + api.version_text + " failed (" + api.error_string(rc) +
                            ") with options" + command + "\n" + result.log);
  }
  size_t cubin_size = 0;
  rc = api.cubin_size(program, &cubin_size);
  if (rc == NVRTC_SUCCESS && cubin_size > 0) {
    result.cubin.resize(cubin_size);
    rc = api.get_cubin(program, result.cubin.data());
  }
  if (rc != NVRTC_SUCCESS || cubin_size == 0) {
    throw Error(kernel, std::string("nvrtcGetCUBIN: ") + api.error_string(rc) + "\n" + result.log);
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  detail::parse_ptxas_info(result.log, spec.entry, &result.registers, &result.spill_bytes);
  ++g_compile_count;
  if (verbose()) {
    std::fprintf(stderr, "flashport: compiled %s in %.2f s, %d registers, %d bytes spilled\n",
                 spec.key().c_str(), result.seconds, result.registers, result.spill_bytes);
  }
  return result;
}

/// One kernel's in-process state: the first caller compiles under `mutex`, later and concurrent
/// callers wait for it and copy the result. A failed compile leaves no result (the next caller retries).
struct MemoryEntry {
  std::mutex mutex;
  std::optional<CompileResult> result;
};

std::mutex g_memory_mutex;
std::unordered_map<std::string, std::shared_ptr<MemoryEntry>> g_memory;  // key text -> entry

}  // namespace

namespace detail {

void parse_ptxas_info(const std::string& log, const std::string& entry, int* registers, int* spill_bytes) {
  // ptxas -v prints, per entry: "Compiling entry function 'E' for 'sm_90a'", "Function properties
  // for F" followed by "N bytes stack frame, S bytes spill stores, L bytes spill loads", then
  // "Used R registers, ...". Spills of non-entry (device) functions count against every entry.
  std::string current_entry, properties_of;
  std::set<std::string> entries;
  std::map<std::string, int> spills_of;
  int entry_registers = -1, max_registers = -1;
  size_t begin = 0;
  while (begin < log.size()) {
    size_t end = log.find('\n', begin);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(begin, end - begin);
    begin = end + 1;
    constexpr std::string_view kEntry = "Compiling entry function '",
                               kProperties = "Function properties for ";
    if (size_t p = line.find(kEntry); p != std::string::npos) {
      p += kEntry.size();
      current_entry = line.substr(p, line.find('\'', p) - p);
      entries.insert(current_entry);
    } else if (size_t q = line.find(kProperties); q != std::string::npos) {
      properties_of = line.substr(q + kProperties.size());
      while (!properties_of.empty() && std::isspace(static_cast<unsigned char>(properties_of.back()))) {
        properties_of.pop_back();
      }
    } else if (size_t s = line.find("bytes stack frame"); s != std::string::npos) {
      unsigned long stack = 0, stores = 0, loads = 0;
      const size_t digits = line.find_first_of("0123456789");
      if (digits != std::string::npos &&
          std::sscanf(line.c_str() + digits,
                      "%lu bytes stack frame, %lu bytes spill stores, %lu bytes spill loads", &stack, &stores,
                      &loads) == 3) {
        spills_of[properties_of] += static_cast<int>(stores + loads);
      }
    } else if (size_t u = line.find("Used "); u != std::string::npos) {
      int value = -1;
      if (std::sscanf(line.c_str() + u, "Used %d registers", &value) == 1) {
        if (current_entry == entry) entry_registers = value;
        max_registers = std::max(max_registers, value);
      }
    }
  }
  int spills = 0;
  for (const auto& [function, bytes] : spills_of) {
    if (function == entry || !entries.count(function)) spills += bytes;
  }
  *registers = entry_registers >= 0 ? entry_registers : max_registers;
  *spill_bytes = spills;
}

}  // namespace detail

CompileResult compile(const KernelSpec& spec) {
  const CacheKey key = cache_key(spec);
  std::shared_ptr<MemoryEntry> entry;
  {
    std::lock_guard lock(g_memory_mutex);
    auto& slot = g_memory[key.text];
    if (!slot) slot = std::make_shared<MemoryEntry>();
    entry = slot;
  }
  std::lock_guard lock(entry->mutex);
  if (entry->result) {
    CompileResult hit = *entry->result;
    hit.from_cache = true;
    hit.seconds = 0.0;
    return hit;
  }
  const std::string write_dir = cache_dir();
  const std::string read_dir = write_dir.empty() ? detail::readable_cache_dir() : write_dir;
  if (!read_dir.empty()) {
    if (auto cached = detail::read_cache_entry(entry_path(read_dir, spec, key), key.text)) {
      entry->result = *cached;
      return *cached;
    }
  }
  CompileResult result = compile_with_nvrtc(spec);
  if (!write_dir.empty()) {
    std::string error;
    const std::string path = entry_path(write_dir, spec, key);
    if (!detail::write_cache_entry(path, key.text, result, &error)) {
      detail::mark_cache_dir_unusable(write_dir, error);
    } else {
      // Only a write can grow the directory, so this is the one place the cap needs checking.
      const PruneStats pruned = prune_cache(write_dir, cache_max_bytes(), path);
      if (verbose() && (pruned.removed > 0 || pruned.temps_removed > 0)) {
        std::fprintf(stderr,
                     "flashport: pruned the kernel cache: %zu entries (%.1f MB) and %zu stale temp files "
                     "removed, %zu entries (%.1f MB) remain\n",
                     pruned.removed, pruned.removed_bytes / 1048576.0, pruned.temps_removed, pruned.remaining,
                     pruned.remaining_bytes / 1048576.0);
      }
    }
  }
  entry->result = result;
  return result;
}

std::string cache_file(const KernelSpec& spec) {
  const std::string dir = cache_dir();
  return dir.empty() ? dir : entry_path(dir, spec, cache_key(spec));
}

size_t compile_count() {
  return g_compile_count.load();
}

void drop_memory_cache() {
  std::lock_guard lock(g_memory_mutex);
  g_memory.clear();
}

std::string nvrtc_version() {
  return nvrtc().version_text;
}
std::string nvrtc_library() {
  return nvrtc().library;
}

}  // namespace flashport::jit
