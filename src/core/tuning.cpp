// The environment knobs (see tuning.hpp): one parser per value syntax, one line per knob.
#include "core/tuning.hpp"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string_view>

namespace flashport::core {
namespace {

/// The variable's text; "" when unset (unset and empty mean the same for every knob).
std::string text_of(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v ? v : "";
}

/// `text` as a whole decimal int (no sign, spaces or suffix); false otherwise.
bool parse_int(std::string_view text, int& out) {
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, out);
  return !text.empty() && text[0] != '-' && ec == std::errc() && stop == end;
}

std::string one_of(std::initializer_list<const char*> values) {
  std::string list;
  for (const char* v : values) list += std::string(list.empty() ? "" : ", ") + "'" + v + "'";
  return list;
}

/// A knob whose value is one word of `values` (or unset: ""). `aliases_of_unset` also mean "".
Knob<std::string> word(const EnvLookup& env, const char* name, std::initializer_list<const char*> values,
                       std::initializer_list<const char*> aliases_of_unset = {}) {
  Knob<std::string> k{name, text_of(env, name)};
  for (const char* alias : aliases_of_unset)
    if (k.value == alias) k.value.clear();
  if (k.value.empty()) return k;
  for (const char* v : values)
    if (k.value == v) return k;
  k.error = "expected one of " + one_of(values) + " or unset, got '" + k.value + "'";
  return k;
}

/// A knob that is an int in [lo, hi]; `unset` when unset or empty.
Knob<int> small_int(const EnvLookup& env, const char* name, int lo, int hi, int unset) {
  Knob<int> k{name, unset};
  const std::string text = text_of(env, name);
  if (text.empty()) return k;
  int v = 0;
  if (parse_int(text, v) && v >= lo && v <= hi) {
    k.value = v;
  } else {
    k.error = "expected an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
              " or unset, got '" + text + "'";
  }
  return k;
}

/// A switch: "1" on, "0" off, unset `unset`.
Knob<bool> flag(const EnvLookup& env, const char* name, bool unset = false) {
  const Knob<int> v = small_int(env, name, 0, 1, unset ? 1 : 0);
  return {name, v.value == 1,
          v.error.empty() ? "" : "expected '0', '1' or unset, got '" + text_of(env, name) + "'"};
}

Knob<BwdTileSetting> bwd_tile(const EnvLookup& env) {
  Knob<BwdTileSetting> k{"FLASHPORT_BWD_TILE"};
  const std::string text = text_of(env, k.name);
  if (text.empty()) return k;
  std::vector<int> v;
  const bool ok = parse_ints(text, ',', v) && v.size() == 3 && v[0] > 0 && v[0] % 16 == 0 && v[1] > 0 &&
                  v[1] % 16 == 0 && (v[2] == 4 || v[2] == 8);
  if (ok) {
    k.value = {v[0], v[1], v[2]};
  } else {
    k.error =
        "expected 'block_m,block_n,warps' (block_m and block_n positive multiples of 16, warps 4 or 8), "
        "got '" +
        text + "'";
  }
  return k;
}

/// FLASHPORT_HOPPER_TILE or FLASHPORT_HOPPER_FP8_TILE (`name`): comma-separated tile entries.
Knob<std::vector<HopperTileSetting>> hopper_tile(const EnvLookup& env, const char* name) {
  Knob<std::vector<HopperTileSetting>> k{name};
  const std::string text = text_of(env, k.name);
  if (text.empty()) return k;
  std::vector<int> v;
  for (size_t start = 0;;) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string entry = text.substr(start, comma - start);
    if (!parse_ints(entry, ':', v) || v.size() < 3 || v.size() > 5) {
      k.error = "expected comma-separated 'd:block_n:stages[:exp_emu[:block_m]]' entries, got '" + entry +
                "' in '" + text + "'";
      return k;
    }
    k.value.push_back({v[0], v[1], v[2], v.size() >= 4 ? v[3] : 0, v.size() == 5 ? v[4] : 0});
    if (comma == text.size()) break;
    start = comma + 1;
  }
  return k;
}

/// FLASHPORT_JIT_DEFINES: space-separated NAME or NAME=VALUE, NAME an identifier, VALUE without spaces.
Knob<std::vector<std::string>> jit_defines(const EnvLookup& env) {
  Knob<std::vector<std::string>> k{"FLASHPORT_JIT_DEFINES"};
  const std::string text = text_of(env, k.name);
  for (size_t start = 0; start < text.size();) {
    const size_t space = std::min(text.find(' ', start), text.size());
    const std::string entry = text.substr(start, space - start);
    start = space + 1;
    if (entry.empty()) continue;
    const size_t name_end = std::min(entry.find('='), entry.size());
    bool ok = name_end > 0 && !std::isdigit((unsigned char)entry[0]);
    for (size_t i = 0; i < name_end; ++i)
      ok = ok && (std::isalnum((unsigned char)entry[i]) || entry[i] == '_');
    if (!ok) {
      k.error = "expected space-separated NAME or NAME=VALUE defines, got '" + entry + "' in '" + text + "'";
      k.value.clear();
      return k;
    }
    k.value.push_back(entry);
  }
  return k;
}

/// `text` as a whole number of megabytes that fits in bytes, into `mb`; why not otherwise.
std::string megabytes(const std::string& text, uint64_t& mb) {
  const char* end = text.data() + text.size();
  const auto [stop, ec] = std::from_chars(text.data(), end, mb);
  if (text.empty() || ec == std::errc::invalid_argument || stop != end)
    return "expected a whole number of megabytes (0 = unlimited), got '" + text + "'";
  if (ec == std::errc::result_out_of_range || mb > (UINT64_MAX >> 20))
    return "'" + text + "' megabytes is more than can be counted in bytes (0 = unlimited)";
  return {};
}

}  // namespace

/// Whole decimal ints separated by `sep` ("64:128:2"); false when any part is not one.
bool parse_ints(std::string_view text, char sep, std::vector<int>& out) {
  out.clear();
  for (size_t start = 0;;) {
    const size_t stop = text.find(sep, start);
    int v = 0;
    if (!parse_int(text.substr(start, stop - start), v)) return false;
    out.push_back(v);
    if (stop == std::string_view::npos) return true;
    start = stop + 1;
  }
}

const EnvLookup& process_env() {
  static const EnvLookup lookup = [](const char* name) -> const char* { return std::getenv(name); };
  return lookup;
}

Tuning parse_tuning(const EnvLookup& env) {
  Tuning t;
  t.cuda_forward = word(env, "FLASHPORT_CUDA_FORWARD", {"portable", "hopper"}, {"auto"});
  t.cuda_backward = word(env, "FLASHPORT_CUDA_BACKWARD", {"portable", "hopper"}, {"auto"});
  t.hopper_tile = hopper_tile(env, "FLASHPORT_HOPPER_TILE");
  t.hopper_persistent = small_int(env, "FLASHPORT_HOPPER_PERSISTENT", 0, 2, -1);
  t.hopper_paged_gather = small_int(env, "FLASHPORT_HOPPER_PAGED_GATHER", 0, 256, 128);
  t.hopper_fp8 = flag(env, "FLASHPORT_HOPPER_FP8", true);
  t.autotune = flag(env, "FLASHPORT_AUTOTUNE");
  t.bwd_tile = bwd_tile(env);
  t.bwd_pipe = small_int(env, "FLASHPORT_BWD_PIPE", 0, 3, -1);
  t.bwd_stages = small_int(env, "FLASHPORT_BWD_STAGES", 1, 2, 0);
  t.decode_variant = small_int(env, "FLASHPORT_DECODE", 0, 9, 1);
  t.decode_cluster = flag(env, "FLASHPORT_DECODE_CLUSTER", true);
  t.bwd_general = flag(env, "FLASHPORT_BWD_GENERAL");
  t.hopper_bwd_dq = small_int(env, "FLASHPORT_HOPPER_BWD_DQ", 0, 1, 1);
  t.hopper_bwd_pair = flag(env, "FLASHPORT_HOPPER_BWD_PAIR");
  t.hopper_bwd_pipe = small_int(env, "FLASHPORT_HOPPER_BWD_PIPE", 0, 3, -1);
  const Knob<std::string> block_m = word(env, "FLASHPORT_HOPPER_BWD_BLOCK_M", {"64", "128"});
  t.hopper_bwd_block_m = {block_m.name, block_m.value.empty() ? 0 : std::stoi(block_m.value), block_m.error};
  t.hopper_bwd_order = small_int(env, "FLASHPORT_HOPPER_BWD_ORDER", 0, 1, 0);
  t.hopper_bwd_keys_outer = small_int(env, "FLASHPORT_HOPPER_BWD_KEYS_OUTER", 0, 2, 1);
  t.hopper_bwd_dq_rows = small_int(env, "FLASHPORT_HOPPER_BWD_DQ_ROWS", 0, 1, -1);
  t.hopper_fp8_tile = hopper_tile(env, "FLASHPORT_HOPPER_FP8_TILE");
  t.jit_verbose = flag(env, "FLASHPORT_JIT_VERBOSE");
  t.device_checks = flag(env, "FLASHPORT_DEVICE_CHECKS", true);
  t.keep_scratch = flag(env, "FLASHPORT_KEEP_SCRATCH", true);
  t.overlap_launches = flag(env, "FLASHPORT_OVERLAP_LAUNCHES", true);
  t.nvrtc_path = {"FLASHPORT_NVRTC_PATH", text_of(env, "FLASHPORT_NVRTC_PATH")};
  t.jit_defines = jit_defines(env);
  t.hip_runtime = {"FLASHPORT_HIP_RUNTIME", text_of(env, "FLASHPORT_HIP_RUNTIME")};
  t.cuda_home = text_of(env, "CUDA_HOME");
  t.cuda_path = text_of(env, "CUDA_PATH");
  return t;
}

const Tuning& tuning() {
  static const Tuning t = parse_tuning(process_env());
  return t;
}

std::string cache_dir_setting(const EnvLookup& env) {
  if (std::string dir = text_of(env, "FLASHPORT_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string xdg = text_of(env, "XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/flashport";
  std::string home = text_of(env, "HOME");
  if (home.empty()) {
    const passwd* pw = getpwuid(getuid());
    home = pw && pw->pw_dir ? pw->pw_dir : "";
  }
  return home.empty() ? home : home + "/.cache/flashport";
}

uint64_t parse_cache_max_mb(const std::string& text, const std::string& name) {
  uint64_t mb = 0;
  if (const std::string why = megabytes(text, mb); !why.empty()) throw Error(name, why);
  return mb;
}

Knob<uint64_t> cache_max_mb_setting(const EnvLookup& env, uint64_t default_mb) {
  Knob<uint64_t> k{"FLASHPORT_CACHE_MAX_MB", default_mb};
  if (const std::string text = text_of(env, k.name); !text.empty()) k.error = megabytes(text, k.value);
  return k;
}

Knob<std::string> cpu_isa_setting(const EnvLookup& env) {
  return word(env, "FLASHPORT_CPU_ISA", {"amx", "avx512", "avx2", "base"});
}

}  // namespace flashport::core
