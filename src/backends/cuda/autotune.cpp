// The autotuning store: one text file per (GPU name, driver version) in the kernel cache directory,
// "key value" per line, loaded once per process and rewritten whole (temp file + rename) on a store.
#include "backends/cuda/autotune.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "jit/detail.hpp"
#include "jit/jit.hpp"

namespace flashport::cuda::autotune {
namespace {

struct Table {
  bool loaded = false;
  std::map<std::string, std::string> entries;
};

std::mutex g_mutex;
std::map<std::string, Table> g_tables;  // by file path ("memory:<file name>" without a directory)
bool g_warned = false;                  // the one "kept in memory" warning was printed

bool printable(char c) {
  return static_cast<unsigned char>(c) >= 0x20 && c != 0x7f;
}

bool valid_key(const std::string& key) {
  if (key.empty() || key.front() == ' ' || key.back() == ' ' || key.front() == '#') return false;
  for (char c : key)
    if (!printable(c)) return false;
  return true;
}

bool valid_value(const std::string& value) {
  if (value.empty()) return false;
  for (char c : value)
    if (!printable(c) || c == ' ') return false;
  return true;
}

/// Entries of the file at `path`; a missing or unreadable file has none. A line is "key value"
/// split at its last space; comments ('#'), lines with control bytes or no value, and a final line
/// without its newline (a foreign partial write) are skipped.
std::map<std::string, std::string> read_entries(const std::string& path) {
  std::map<std::string, std::string> entries;
  std::FILE* file = path.empty() ? nullptr : std::fopen(path.c_str(), "rb");
  if (!file) return entries;
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    const std::string line = text.substr(start, end - start);
    const size_t space = line.rfind(' ');
    if (space == std::string::npos) continue;
    std::string key = line.substr(0, space), value = line.substr(space + 1);
    if (valid_key(key) && valid_value(value)) entries[std::move(key)] = std::move(value);
  }
  return entries;
}

/// Writes `entries` to `path` through a temp file in the same directory and rename(), so readers
/// in other processes see the old file or the new one, never a mix. False with `error` set on failure.
bool write_entries(const std::string& path, const std::string& header,
                   const std::map<std::string, std::string>& entries, std::string* error) {
  static std::atomic<unsigned long long> counter{0};
  const std::string temp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter++);
  std::FILE* file = std::fopen(temp.c_str(), "wx");
  if (!file) {
    *error = "cannot create " + temp + ": " + std::strerror(errno);
    return false;
  }
  bool ok = std::fputs(header.c_str(), file) >= 0;
  for (const auto& [key, value] : entries) {
    ok = ok && std::fprintf(file, "%s %s\n", key.c_str(), value.c_str()) > 0;
  }
  if (!ok) *error = "cannot write " + temp + ": " + std::strerror(errno);
  if (std::fclose(file) != 0 && ok) {
    ok = false;
    *error = "cannot write " + temp + ": " + std::strerror(errno);
  }
  if (ok && std::rename(temp.c_str(), path.c_str()) != 0) {
    ok = false;
    *error = "cannot rename to " + path + ": " + std::strerror(errno);
  }
  if (!ok) ::unlink(temp.c_str());
  return ok;
}

/// The table for `path` (or the in-memory one named after the file), loaded on first use.
/// Caller holds g_mutex.
Table& table_for(const std::string& path, const std::string& name) {
  Table& table = g_tables[path.empty() ? "memory:" + name : path];
  if (!table.loaded) {
    table.entries = read_entries(path);
    table.loaded = true;
  }
  return table;
}

void warn_memory_only(const std::string& why) {
  if (g_warned) return;
  g_warned = true;
  std::fprintf(stderr,
               "flashport: warning: autotune results are kept in memory only (%s); later processes will "
               "tune again (set FLASHPORT_CACHE_DIR to a writable directory)\n",
               why.c_str());
}

/// jit::device_name, asked once per device.
std::string gpu_name(int device) {
  static std::mutex mutex;
  static std::map<int, std::string> names;
  std::lock_guard lock(mutex);
  auto it = names.find(device);
  if (it == names.end()) it = names.emplace(device, jit::device_name(device)).first;
  return it->second;
}

}  // namespace

bool enabled() {
  return core::tuning().autotune.get();
}

std::string file_name(const std::string& gpu_name, int driver_version) {
  std::string name = gpu_name.empty() ? "unknown" : gpu_name;
  for (char& c : name) {
    const bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
    if (!keep) c = '_';
  }
  return "autotune-" + name + "-drv" + std::to_string(driver_version) + ".txt";
}

std::string file_path(const std::string& gpu_name, int driver_version) {
  const std::string dir = jit::detail::readable_cache_dir();
  return dir.empty() ? dir : dir + "/" + file_name(gpu_name, driver_version);
}

std::optional<std::string> lookup(const std::string& gpu_name, int driver_version, const std::string& key) {
  const std::string path = file_path(gpu_name, driver_version);
  std::lock_guard lock(g_mutex);
  const Table& table = table_for(path, file_name(gpu_name, driver_version));
  if (auto it = table.entries.find(key); it != table.entries.end()) return it->second;
  return std::nullopt;
}

void store(const std::string& gpu_name, int driver_version, const std::string& key,
           const std::string& value) {
  if (!valid_key(key)) throw Error("key", "autotune keys are non-empty printable text, got '" + key + "'");
  if (!valid_value(value))
    throw Error("value", "autotune values are non-empty printable text without spaces, got '" + value + "'");
  const std::string writable_dir = jit::cache_dir();  // creates the directory if it can
  const std::string path = file_path(gpu_name, driver_version);
  std::lock_guard lock(g_mutex);
  Table& table = table_for(path, file_name(gpu_name, driver_version));
  table.entries[key] = value;
  if (writable_dir.empty() || path.empty()) {
    warn_memory_only("no writable kernel cache directory");
    return;
  }
  // Entries other processes stored since this one loaded the file are kept; ours win on conflicts.
  std::map<std::string, std::string> merged = read_entries(path);
  for (const auto& [k, v] : table.entries) merged[k] = v;
  table.entries = merged;
  const std::string header = "# flashport autotune results for " + gpu_name + ", CUDA driver " +
                             std::to_string(driver_version) + ": one \"key value\" per line\n";
  std::string error;
  if (!write_entries(path, header, merged, &error)) warn_memory_only(error);
}

std::optional<std::string> lookup(int device, const std::string& key) {
  return lookup(gpu_name(device), jit::driver_version(), key);
}

void store(int device, const std::string& key, const std::string& value) {
  store(gpu_name(device), jit::driver_version(), key, value);
}

void reset_for_testing() {
  std::lock_guard lock(g_mutex);
  g_tables.clear();
  g_warned = false;
}

}  // namespace flashport::cuda::autotune
