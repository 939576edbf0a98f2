// The on-disk kernel cache: directory resolution, the entry format (header + key + log + cubin),
// validation of damaged entries, and atomic writes (temp file + rename) safe across processes.
#include <fcntl.h>
#include <pwd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "jit/detail.hpp"

namespace flashport::jit {
namespace detail {
namespace {

constexpr char kMagic[8] = {'F', 'P', 'J', 'I', 'T', 'C', 'B', '\0'};
constexpr uint32_t kFormatVersion = 1;

/// Fixed-size prefix of an entry; native byte order (the cache is local to one machine). The
/// checksum covers everything after the header.
struct EntryHeader {
  char magic[8];
  uint32_t format_version;
  uint32_t header_bytes;
  int32_t registers;
  int32_t spill_bytes;
  uint64_t key_bytes, log_bytes, cubin_bytes;
  uint64_t checksum;
};

std::mutex g_state_mutex;
std::map<std::string, bool> g_dir_usable;  // guarded by g_state_mutex
std::set<std::string> g_reported_entries;  // guarded by g_state_mutex

std::string configured_cache_dir() {
  if (const char* dir = std::getenv("FLASHPORT_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/flashport";
  const char* home = std::getenv("HOME");
  if (!home || !*home) {
    const passwd* pw = getpwuid(getuid());
    home = pw ? pw->pw_dir : nullptr;
  }
  return home && *home ? std::string(home) + "/.cache/flashport" : std::string();
}

void report_damaged(const std::string& path, const std::string& reason) {
  {
    std::lock_guard lock(g_state_mutex);
    if (!g_reported_entries.insert(path).second) return;
  }
  std::fprintf(stderr, "flashport: kernel cache entry %s is damaged (%s); recompiling it\n", path.c_str(),
               reason.c_str());
}

bool write_all(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

void mark_cache_dir_unusable(const std::string& dir, const std::string& reason) {
  {
    std::lock_guard lock(g_state_mutex);
    auto [it, inserted] = g_dir_usable.try_emplace(dir, false);
    if (!inserted && !it->second) return;  // already reported
    it->second = false;
  }
  std::fprintf(stderr,
               "flashport: warning: kernel cache directory %s is not writable (%s); newly compiled kernels "
               "are kept in memory only (set FLASHPORT_CACHE_DIR to a writable directory)\n",
               dir.c_str(), reason.c_str());
}

std::optional<CompileResult> read_cache_entry(const std::string& path, const std::string& key_text) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) return std::nullopt;  // a miss (or unreadable: rebuilt and overwritten)
  std::vector<char> bytes;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;)
    bytes.insert(bytes.end(), buffer, buffer + n);
  const bool read_error = std::ferror(file);
  std::fclose(file);
  if (read_error) return report_damaged(path, "read error"), std::nullopt;

  EntryHeader header;
  if (bytes.size() < sizeof header) return report_damaged(path, "truncated header"), std::nullopt;
  std::memcpy(&header, bytes.data(), sizeof header);
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0)
    return report_damaged(path, "bad magic"), std::nullopt;
  if (header.format_version != kFormatVersion || header.header_bytes != sizeof header) {
    return report_damaged(path, "unknown format version"), std::nullopt;
  }
  const uint64_t payload = header.key_bytes + header.log_bytes + header.cubin_bytes;
  if (header.key_bytes > bytes.size() || header.log_bytes > bytes.size() ||
      header.cubin_bytes > bytes.size() || payload != bytes.size() - sizeof header) {
    return report_damaged(path, "size mismatch"), std::nullopt;
  }
  const char* p = bytes.data() + sizeof header;
  if (fnv1a(std::string_view(p, payload)) != header.checksum) {
    return report_damaged(path, "checksum mismatch"), std::nullopt;
  }
  if (std::string_view(p, header.key_bytes) != key_text) {
    return report_damaged(path, "key mismatch (hash collision?)"), std::nullopt;
  }
  p += header.key_bytes;
  CompileResult result;
  result.log.assign(p, header.log_bytes);
  p += header.log_bytes;
  result.cubin.assign(p, p + header.cubin_bytes);
  if (result.cubin.size() < 4 || std::memcmp(result.cubin.data(),
                                             "\x7f"
                                             "ELF",
                                             4) != 0) {
    return report_damaged(path, "payload is not an ELF cubin"), std::nullopt;
  }
  result.registers = header.registers;
  result.spill_bytes = header.spill_bytes;
  result.from_cache = true;
  return result;
}

bool write_cache_entry(const std::string& path, const std::string& key_text, const CompileResult& result,
                       std::string* error) {
  EntryHeader header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.format_version = kFormatVersion;
  header.header_bytes = sizeof header;
  header.registers = result.registers;
  header.spill_bytes = result.spill_bytes;
  header.key_bytes = key_text.size();
  header.log_bytes = result.log.size();
  header.cubin_bytes = result.cubin.size();
  uint64_t sum = fnv1a(key_text);
  sum = fnv1a(result.log, sum);
  sum = fnv1a(std::string_view(result.cubin.data(), result.cubin.size()), sum);
  header.checksum = sum;

  // Unique per process and per call, so concurrent writers never share a temp file; rename()
  // within one directory is atomic, so readers see either no entry or a complete one.
  static std::atomic<unsigned long long> counter{0};
  const std::string temp = path + ".tmp." + std::to_string(getpid()) + "." +
                           std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 100000) +
                           "." + std::to_string(counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = "cannot create " + temp + ": " + std::strerror(errno);
    return false;
  }
  bool ok = write_all(fd, reinterpret_cast<const char*>(&header), sizeof header) &&
            write_all(fd, key_text.data(), key_text.size()) &&
            write_all(fd, result.log.data(), result.log.size()) &&
            write_all(fd, result.cubin.data(), result.cubin.size());
  if (!ok) *error = "cannot write " + temp + ": " + std::strerror(errno);
  if (::close(fd) != 0 && ok) {
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

std::string readable_cache_dir() {
  const std::string dir = configured_cache_dir();
  std::error_code ec;
  return !dir.empty() && std::filesystem::is_directory(dir, ec) && ::access(dir.c_str(), R_OK | X_OK) == 0
             ? dir
             : "";
}

}  // namespace detail

std::string cache_dir() {
  const std::string dir = detail::configured_cache_dir();
  if (dir.empty()) return dir;
  {
    std::lock_guard lock(detail::g_state_mutex);
    if (auto it = detail::g_dir_usable.find(dir); it != detail::g_dir_usable.end())
      return it->second ? dir : "";
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!std::filesystem::is_directory(dir)) {
    detail::mark_cache_dir_unusable(dir, ec ? ec.message() : "not a directory");
    return "";
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    detail::mark_cache_dir_unusable(dir, std::strerror(errno));
    return "";
  }
  std::lock_guard lock(detail::g_state_mutex);
  detail::g_dir_usable.try_emplace(dir, true);
  return dir;
}

}  // namespace flashport::jit
