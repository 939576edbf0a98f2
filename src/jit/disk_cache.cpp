// The on-disk kernel cache: directory resolution, the entry format (header + key + log + cubin),
// validation of damaged entries, atomic writes (temp file + rename) safe across processes, and
// least-recently-used pruning to a size cap.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "core/tuning.hpp"
#include "flashport/error.hpp"
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

constexpr std::string_view kEntrySuffix = ".cubin";
constexpr std::string_view kTempInfix = ".tmp.";  // write_cache_entry's and the autotune store's
// A writer's temp file lives from the end of its compile to its rename (milliseconds); one this old
// belongs to a writer that crashed.
constexpr auto kStaleTempAge = std::chrono::minutes(10);
constexpr const char* kLockName = ".prune.lock";

std::mutex g_state_mutex;
std::map<std::string, bool> g_dir_usable;     // guarded by g_state_mutex
std::set<std::string> g_reported_entries;     // guarded by g_state_mutex
std::set<std::string> g_reported_cap_values;  // guarded by g_state_mutex

std::string configured_cache_dir() {
  return core::cache_dir_setting(core::process_env());
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
  // Recency for pruning. Fails harmlessly in a read-only shared cache (not ours to prune) and when a
  // pruner removed the entry since it was read (the bytes read are complete either way).
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
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

std::string entry_file_name(const std::string& entry, int arch, uint64_t key_hash) {
  std::string name;
  for (char c : entry) name += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
  return name.substr(0, 64) + "-sm" + std::to_string(arch) + "-" + hex64(key_hash) +
         std::string(kEntrySuffix);
}

bool is_entry_file_name(std::string_view name) {
  auto all_of = [](std::string_view text, auto predicate) {
    return !text.empty() && std::all_of(text.begin(), text.end(),
                                        [&](char c) { return predicate(static_cast<unsigned char>(c)); });
  };
  constexpr size_t kHashDigits = 16;
  if (!name.ends_with(kEntrySuffix)) return false;
  name.remove_suffix(kEntrySuffix.size());
  if (name.size() < kHashDigits + 1 || name[name.size() - kHashDigits - 1] != '-') return false;
  if (!all_of(name.substr(name.size() - kHashDigits),
              [](int c) { return std::isxdigit(c) && !std::isupper(c); }))
    return false;
  name.remove_suffix(kHashDigits + 1);
  const size_t sm = name.rfind("-sm");
  return sm != std::string_view::npos && all_of(name.substr(sm + 3), [](int c) { return std::isdigit(c); }) &&
         all_of(name.substr(0, sm), [](int c) { return std::isalnum(c) || c == '_'; });
}

namespace {

/// A crashed writer's leftover: "<entry>.tmp.<...>" or the autotune store's "autotune-<...>.txt.tmp.<...>".
bool is_temp_file_name(std::string_view name) {
  const size_t infix = name.find(kTempInfix);
  if (infix == std::string_view::npos) return false;
  const std::string_view target = name.substr(0, infix);
  return is_entry_file_name(target) || (target.starts_with("autotune-") && target.ends_with(".txt"));
}

/// An entry as listed: enough to notice, just before removing it, that it was used or replaced since.
struct Listed {
  std::string path;
  uint64_t bytes;
  timespec mtime;
  ino_t inode;
};

bool same_version(const struct stat& st, const Listed& entry) {
  return st.st_ino == entry.inode && st.st_mtim.tv_sec == entry.mtime.tv_sec &&
         st.st_mtim.tv_nsec == entry.mtime.tv_nsec;
}

/// The directory's prune lock, taken without waiting: a second pruner would only race the first
/// for the same files. flock belongs to the open file description, so it excludes threads of one
/// process as well as processes, and it is released when the holder exits or crashes.
class PruneLock {
 public:
  explicit PruneLock(const std::string& dir) {
    const std::string path = dir + "/" + kLockName;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      error_ = "cannot open " + path + ": " + std::strerror(errno);
      return;
    }
    int rc;
    while ((rc = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
    }
    held_ = rc == 0;
    if (rc != 0 && errno != EWOULDBLOCK) error_ = "cannot lock " + path + ": " + std::strerror(errno);
  }
  ~PruneLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  PruneLock(const PruneLock&) = delete;
  PruneLock& operator=(const PruneLock&) = delete;
  bool held() const { return held_; }
  const std::string& error() const { return error_; }

 private:
  int fd_ = -1;
  bool held_ = false;
  std::string error_;
};

/// Removes stale temp files; then, when the entries total more than `trigger_bytes`, the least
/// recently used ones until they total at most `target_bytes`, never the one named `keep`.
PruneStats prune_pass(const std::string& dir, uint64_t trigger_bytes, uint64_t target_bytes,
                      const std::string& keep, const PruneCallback& on_remove) {
  PruneStats stats;
  PruneLock lock(dir);
  stats.error = lock.error();
  stats.skipped = stats.error.empty() && !lock.held();
  if (!lock.held()) return stats;

  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  if (ec) {
    stats.error = "cannot list " + dir + ": " + ec.message();
    return stats;
  }
  const auto stale_before = std::chrono::system_clock::now() - kStaleTempAge;
  std::vector<Listed> entries;
  uint64_t total = 0;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool entry = is_entry_file_name(name);
    if (!entry && !is_temp_file_name(name)) continue;  // the lock, autotune results, foreign files
    const std::string path = it->path().string();
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // removed since listed
    if (entry) {
      entries.push_back({path, static_cast<uint64_t>(st.st_size), st.st_mtim, st.st_ino});
      total += entries.back().bytes;
    } else if (std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec) < stale_before &&
               ::unlink(path.c_str()) == 0) {
      ++stats.temps_removed;
    }
  }

  size_t vanished = 0;
  if (total > trigger_bytes) {
    std::sort(entries.begin(), entries.end(), [](const Listed& a, const Listed& b) {
      return std::tie(a.mtime.tv_sec, a.mtime.tv_nsec, a.path) <
             std::tie(b.mtime.tv_sec, b.mtime.tv_nsec, b.path);
    });
    const std::string keep_name = std::filesystem::path(keep).filename().string();
    for (const Listed& entry : entries) {
      if (total <= target_bytes) break;
      if (!keep_name.empty() && std::filesystem::path(entry.path).filename() == keep_name) continue;
      // Checked again just before removing: an entry a reader used (mtime refreshed) or a writer
      // replaced since the listing is no longer least recently used. What still slips through this
      // window costs a recompile, never a damaged read: unlink leaves a reader that has the file
      // open its complete copy, and one that opens it afterwards sees a miss.
      struct stat st;
      if (::lstat(entry.path.c_str(), &st) != 0) {
        ++vanished;  // removed by hand since the listing
        total -= entry.bytes;
        continue;
      }
      if (!same_version(st, entry)) continue;
      if (::unlink(entry.path.c_str()) == 0) {
        ++stats.removed;
        stats.removed_bytes += entry.bytes;
        if (on_remove) on_remove(entry.path, entry.bytes);
      } else if (errno != ENOENT) {
        continue;  // not ours to remove (permissions): it stays and counts
      } else {
        ++vanished;
      }
      total -= entry.bytes;
    }
  }
  stats.remaining = entries.size() - stats.removed - vanished;
  stats.remaining_bytes = total;
  return stats;
}

}  // namespace
}  // namespace detail

uint64_t parse_cache_max_mb(const std::string& text, const std::string& name) {
  return core::parse_cache_max_mb(text, name);
}

uint64_t cache_max_bytes() {
  const core::Knob<uint64_t> cap = core::cache_max_mb_setting(core::process_env(), kDefaultCacheMaxMb);
  try {
    return cap.get() << 20;
  } catch (const Error& e) {  // the cap only bounds the cache: reported once, the default serves
    {
      std::lock_guard lock(detail::g_state_mutex);
      if (!detail::g_reported_cap_values.insert(e.what()).second) return kDefaultCacheMaxMb << 20;
    }
    std::fprintf(stderr, "flashport: warning: %s; the kernel cache is capped at the default %llu MB\n",
                 e.what(), static_cast<unsigned long long>(kDefaultCacheMaxMb));
    return kDefaultCacheMaxMb << 20;
  }
}

PruneStats prune_cache(const std::string& dir, uint64_t max_bytes, const std::string& keep,
                       const PruneCallback& on_remove) {
  if (max_bytes == 0) return detail::prune_pass(dir, UINT64_MAX, UINT64_MAX, keep, on_remove);
  // Down to 90%, not just under the cap, so that the next few writes do not each prune again.
  return detail::prune_pass(dir, max_bytes, max_bytes - max_bytes / 10, keep, on_remove);
}

PruneStats clear_cache(const std::string& dir, const PruneCallback& on_remove) {
  return detail::prune_pass(dir, 0, 0, {}, on_remove);
}

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
