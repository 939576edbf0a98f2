// Internals shared by the JIT's translation units: the embedded source table, hashing, and the
// on-disk cache entry format.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jit/jit.hpp"

namespace flashport::jit::detail {

/// One embedded file as the generated table stores it: raw-string chunks to concatenate.
struct EmbeddedFile {
  const char* path;
  const char* const* chunks;
  int chunk_count;
};
extern const EmbeddedFile kEmbeddedFiles[];  // defined in the generated embedded_sources.cpp
extern const int kEmbeddedFileCount;

/// 64-bit FNV-1a, chainable through `seed`.
inline uint64_t fnv1a(std::string_view bytes, uint64_t seed = 0xcbf29ce484222325ull) {
  uint64_t h = seed;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string hex64(uint64_t value);

/// The embedded sources as NVRTC sees them: texts with relative quoted includes rewritten to
/// table paths (NVRTC matches in-memory header names exactly), pointer arrays for
/// nvrtcCreateProgram, and one hash over everything.
struct SourceTable {
  std::vector<std::string> names, texts;
  std::vector<const char*> name_ptrs, text_ptrs;
  std::map<std::string, size_t> index;
  uint64_t hash = 0;
};
const SourceTable& sources();

/// Resource usage from a `--ptxas-options=-v` log for extern "C" kernel `entry`.
void parse_ptxas_info(const std::string& log, const std::string& entry, int* registers, int* spill_bytes);

/// File name of a kernel's cache entry: "<entry>-sm<arch>-<16 hex digits of the key hash>.cubin".
std::string entry_file_name(const std::string& entry, int arch, uint64_t key_hash);
/// Whether `name` has the form entry_file_name gives (pruning touches no other file).
bool is_entry_file_name(std::string_view name);

/// Reads a cache entry; nullopt on a miss. A damaged entry (bad magic, size, checksum, key) is
/// reported once on stderr and treated as a miss so the caller rebuilds it. A hit refreshes the
/// entry's mtime, the recency pruning goes by.
std::optional<CompileResult> read_cache_entry(const std::string& path, const std::string& key_text);
/// Writes atomically (unique temp file in the same directory, then rename); false on failure.
bool write_cache_entry(const std::string& path, const std::string& key_text, const CompileResult& result,
                       std::string* error);
/// CUDA version the installed driver supports (cuDriverGetVersion, e.g. 12080), 0 without libcuda.
int driver_cuda_version();

/// The configured cache directory when it exists and is readable, writable or not (a read-only
/// shared cache filled by flashport-prebuild still serves hits); empty otherwise.
std::string readable_cache_dir();

/// Reports (once per directory) that the cache directory is unusable; later calls to cache_dir()
/// return empty for it.
void mark_cache_dir_unusable(const std::string& dir, const std::string& reason);

}  // namespace flashport::jit::detail
