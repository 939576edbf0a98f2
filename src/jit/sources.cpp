// The embedded kernel sources: assembled from the generated chunk table once, with relative
// includes resolved, and hashed for the cache key.
#include <cstdio>

#include "flashport/error.hpp"
#include "jit/detail.hpp"

namespace flashport::jit {
namespace detail {
namespace {

/// Collapses "." and ".." segments of a '/'-separated relative path.
std::string normalize_path(const std::string& path) {
  std::vector<std::string> parts;
  // Plain string splitting: the library uses no iostreams (a libstdc++ mismatch in a host process such as
  // Python crashes inside locale code).
  for (size_t begin = 0; begin <= path.size();) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    begin = end + 1;
    if (part.empty() || part == ".") continue;
    if (part == ".." && !parts.empty() && parts.back() != "..") {
      parts.pop_back();
    } else {
      parts.push_back(part);
    }
  }
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : "/") + part;
  return out;
}

/// Rewrites `#include "x"` lines whose target is only found relative to the including file's
/// directory to the table path, keeping the line count so compiler line numbers stay right.
std::string resolve_relative_includes(const std::string& name, const std::string& text,
                                      const std::map<std::string, size_t>& index) {
  const size_t slash = name.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : name.substr(0, slash + 1);
  std::string out;
  out.reserve(text.size());
  size_t line_begin = 0;
  while (line_begin < text.size()) {
    size_t line_end = text.find('\n', line_begin);
    if (line_end == std::string::npos) line_end = text.size();
    std::string line = text.substr(line_begin, line_end - line_begin);
    size_t p = line.find_first_not_of(" \t");
    if (p != std::string::npos && line[p] == '#') {
      p = line.find_first_not_of(" \t", p + 1);
      if (p != std::string::npos && line.compare(p, 7, "include") == 0) {
        const size_t open = line.find('"', p + 7);
        const size_t close = open == std::string::npos ? open : line.find('"', open + 1);
        if (close != std::string::npos) {
          const std::string target = line.substr(open + 1, close - open - 1);
          const std::string relative = normalize_path(dir + target);
          if (!index.count(target) && index.count(relative)) {
            line = line.substr(0, open + 1) + relative + line.substr(close);
          }
        }
      }
    }
    out += line;
    if (line_end < text.size()) out += '\n';
    line_begin = line_end + 1;
  }
  return out;
}

SourceTable build_table() {
  std::map<std::string, std::string> files;  // sorted by path: a stable hash order
  for (int i = 0; i < kEmbeddedFileCount; ++i) {
    std::string text;
    for (int c = 0; c < kEmbeddedFiles[i].chunk_count; ++c) text += kEmbeddedFiles[i].chunks[c];
    files[kEmbeddedFiles[i].path] = std::move(text);
  }
  SourceTable table;
  for (const auto& [name, text] : files) {
    table.index[name] = table.names.size();
    table.names.push_back(name);
  }
  uint64_t hash = fnv1a("flashport-sources");
  for (const auto& [name, text] : files) {
    table.texts.push_back(resolve_relative_includes(name, text, table.index));
    hash = fnv1a(name, hash);
    hash = fnv1a(std::string_view("\0", 1), hash);
    hash = fnv1a(table.texts.back(), hash);
    hash = fnv1a(std::string_view("\0", 1), hash);
  }
  table.hash = hash;
  for (size_t i = 0; i < table.names.size(); ++i) {
    table.name_ptrs.push_back(table.names[i].c_str());
    table.text_ptrs.push_back(table.texts[i].c_str());
  }
  return table;
}

}  // namespace

const SourceTable& sources() {
  static const SourceTable table = build_table();
  return table;
}

std::string hex64(uint64_t value) {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016llx", static_cast<unsigned long long>(value));
  return buffer;
}

}  // namespace detail

const std::string& embedded_source(const std::string& path) {
  const auto& table = detail::sources();
  const auto it = table.index.find(path);
  if (it == table.index.end()) {
    throw Error("source", "no embedded kernel source '" + path + "' (paths are relative to src/kernels/)");
  }
  return table.texts[it->second];
}

std::vector<std::string> embedded_paths() {
  return detail::sources().names;
}

std::string KernelSpec::key() const {
  std::string out = source + ":" + entry + ":" + std::to_string(arch) + ":";
  for (size_t i = 0; i < defines.size(); ++i) {
    out += (i ? "," : "") + defines[i].first + "=" + defines[i].second;
  }
  return out;
}

}  // namespace flashport::jit
