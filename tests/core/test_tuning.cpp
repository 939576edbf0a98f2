// The environment knobs (core/tuning.hpp) parsed from a map, never the process environment: every
// knob's default, its valid values, and each malformed value reported as an Error naming the variable.
#include "core/tuning.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

namespace flashport::core {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

Tuning parse(const Env& env) {
  return parse_tuning(lookup(env));
}

/// `knob` holds an error: get() throws an Error naming the variable and quoting `text`.
template <class T>
void expect_rejected(const Knob<T>& knob, const std::string& name, const std::string& text) {
  try {
    knob.get();
    ADD_FAILURE() << name << " accepted '" << text << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), name);
    EXPECT_NE(std::string(e.what()).find("'" + text + "'"), std::string::npos) << e.what();
  }
}

TEST(Tuning, DefaultsWhenUnsetOrEmpty) {
  for (const Env& env : {Env{}, Env{{"FLASHPORT_CUDA_FORWARD", ""},
                                    {"FLASHPORT_CUDA_BACKWARD", ""},
                                    {"FLASHPORT_HOPPER_TILE", ""},
                                    {"FLASHPORT_HOPPER_PERSISTENT", ""},
                                    {"FLASHPORT_HOPPER_PAGED_GATHER", ""},
                                    {"FLASHPORT_AUTOTUNE", ""},
                                    {"FLASHPORT_HOPPER_FP8", ""},
                                    {"FLASHPORT_BWD_TILE", ""},
                                    {"FLASHPORT_BWD_PIPE", ""},
                                    {"FLASHPORT_BWD_STAGES", ""},
                                    {"FLASHPORT_BWD_GENERAL", ""},
                                    {"FLASHPORT_HOPPER_BWD_DQ", ""},
                                    {"FLASHPORT_HOPPER_BWD_PAIR", ""},
                                    {"FLASHPORT_HOPPER_BWD_PIPE", ""},
                                    {"FLASHPORT_HOPPER_BWD_KEYS_OUTER", ""},
                                    {"FLASHPORT_DECODE", ""},
                                    {"FLASHPORT_DECODE_CLUSTER", ""},
                                    {"FLASHPORT_JIT_VERBOSE", ""},
                                    {"FLASHPORT_KEEP_SCRATCH", ""},
                                    {"FLASHPORT_OVERLAP_LAUNCHES", ""},
                                    {"FLASHPORT_NVRTC_PATH", ""}}}) {
    const Tuning t = parse(env);
    EXPECT_EQ(t.cuda_forward.get(), "");
    EXPECT_EQ(t.cuda_backward.get(), "");
    EXPECT_TRUE(t.hopper_tile.get().empty());
    EXPECT_EQ(t.hopper_persistent.get(), -1);     // unset: the Hopper launch rule decides
    EXPECT_EQ(t.hopper_paged_gather.get(), 128);  // every page below the 128-key tile
    EXPECT_FALSE(t.autotune.get());
    EXPECT_TRUE(t.hopper_fp8.get());  // unset: e4m3 runs on the Hopper fp8 forward where it can
    EXPECT_EQ(t.bwd_tile.get().warps, 0);
    EXPECT_EQ(t.bwd_pipe.get(), -1);
    EXPECT_EQ(t.bwd_stages.get(), 0);
    EXPECT_FALSE(t.bwd_general.get());
    EXPECT_EQ(t.hopper_bwd_dq.get(), 1);          // bulk reduce-adds
    EXPECT_FALSE(t.hopper_bwd_pair.get());        // d 256: one CTA per key block (pairs measured slower)
    EXPECT_EQ(t.hopper_bwd_pipe.get(), -1);       // unset: the tile table's loop and stages
    EXPECT_EQ(t.hopper_bwd_block_m.get(), 0);     // unset: the tile table's queries per step
    EXPECT_EQ(t.hopper_bwd_order.get(), 0);       // unset: each step's GEMM groups waited for whole
    EXPECT_EQ(t.hopper_bwd_keys_outer.get(), 1);  // unset: masked calls on short grids, key blocks outside
    EXPECT_TRUE(t.decode_cluster.get());          // unset: split decode grids of 2..8 merge in a cluster
    EXPECT_EQ(t.decode_variant.get(), 1);
    EXPECT_FALSE(t.jit_verbose.get());
    EXPECT_TRUE(t.keep_scratch.get());
    EXPECT_TRUE(t.overlap_launches.get());  // sm_90+: kernels launch while their predecessors finish
    EXPECT_EQ(t.nvrtc_path.get(), "");
  }
}

TEST(Tuning, JitDefines) {
  EXPECT_TRUE(parse({}).jit_defines.get().empty());
  EXPECT_TRUE(parse({{"FLASHPORT_JIT_DEFINES", "  "}}).jit_defines.get().empty());
  const std::vector<std::string> want = {"FP_BWD_ABLATE=3", "X_1", "Y=a=b"};
  EXPECT_EQ(parse({{"FLASHPORT_JIT_DEFINES", " FP_BWD_ABLATE=3  X_1 Y=a=b"}}).jit_defines.get(), want);
  for (const char* bad : {"=1", "1X=2", "A-B", "FP_BWD_ABLATE=1 -DX"})
    expect_rejected(parse({{"FLASHPORT_JIT_DEFINES", bad}}).jit_defines, "FLASHPORT_JIT_DEFINES", bad);
}

TEST(Tuning, KernelChoice) {
  for (const char* name : {"FLASHPORT_CUDA_FORWARD", "FLASHPORT_CUDA_BACKWARD"}) {
    const bool forward = std::string(name) == "FLASHPORT_CUDA_FORWARD";
    const auto knob = [&](const Tuning& t) { return forward ? t.cuda_forward : t.cuda_backward; };
    EXPECT_EQ(knob(parse({{name, "portable"}})).get(), "portable");
    EXPECT_EQ(knob(parse({{name, "hopper"}})).get(), "hopper");
    EXPECT_EQ(knob(parse({{name, "auto"}})).get(), "");
    for (const char* bad : {"Hopper", "sm90", " portable", "1"})
      expect_rejected(knob(parse({{name, bad}})), name, bad);
  }
}

TEST(Tuning, SwitchesOnByDefault) {
  const std::pair<const char*, Knob<bool> Tuning::*> switches[] = {
      {"FLASHPORT_KEEP_SCRATCH", &Tuning::keep_scratch},
      {"FLASHPORT_OVERLAP_LAUNCHES", &Tuning::overlap_launches},
      {"FLASHPORT_DECODE_CLUSTER", &Tuning::decode_cluster}};
  for (const auto& [name, field] : switches) {
    EXPECT_FALSE((parse({{name, "0"}}).*field).get()) << name;
    EXPECT_TRUE((parse({{name, "1"}}).*field).get()) << name;
    for (const char* bad : {"2", "no", "off"}) expect_rejected(parse({{name, bad}}).*field, name, bad);
  }
}

TEST(Tuning, Switches) {
  for (const char* name : {"FLASHPORT_AUTOTUNE", "FLASHPORT_BWD_GENERAL", "FLASHPORT_JIT_VERBOSE",
                           "FLASHPORT_HOPPER_FP8", "FLASHPORT_HOPPER_BWD_PAIR"}) {
    const auto knob = [&](const Env& env) {
      const Tuning t = parse(env);
      const std::string n = name;
      return n == "FLASHPORT_AUTOTUNE"          ? t.autotune
             : n == "FLASHPORT_BWD_GENERAL"     ? t.bwd_general
             : n == "FLASHPORT_HOPPER_FP8"      ? t.hopper_fp8
             : n == "FLASHPORT_HOPPER_BWD_PAIR" ? t.hopper_bwd_pair
                                                : t.jit_verbose;
    };
    EXPECT_TRUE(knob({{name, "1"}}).get());
    EXPECT_FALSE(knob({{name, "0"}}).get());
    for (const char* bad : {"2", "yes", "true", "on", "-1", "01x"})
      expect_rejected(knob({{name, bad}}), name, bad);
  }
}

TEST(Tuning, SmallIntegers) {
  for (int v : {0, 1, 2})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_PERSISTENT", std::to_string(v)}}).hopper_persistent.get(), v);
  for (int v : {0, 1, 2, 3}) EXPECT_EQ(parse({{"FLASHPORT_BWD_PIPE", std::to_string(v)}}).bwd_pipe.get(), v);
  for (int v : {1, 2}) EXPECT_EQ(parse({{"FLASHPORT_BWD_STAGES", std::to_string(v)}}).bwd_stages.get(), v);
  for (int v : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
    EXPECT_EQ(parse({{"FLASHPORT_DECODE", std::to_string(v)}}).decode_variant.get(), v);
  for (const char* bad : {"10", "-1", "on"})
    expect_rejected(parse({{"FLASHPORT_DECODE", bad}}).decode_variant, "FLASHPORT_DECODE", bad);
  for (int v : {0, 1})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_BWD_DQ", std::to_string(v)}}).hopper_bwd_dq.get(), v);
  for (const char* bad : {"2", "-1", "bulk"})
    expect_rejected(parse({{"FLASHPORT_HOPPER_BWD_DQ", bad}}).hopper_bwd_dq, "FLASHPORT_HOPPER_BWD_DQ", bad);
  for (int v : {0, 1, 2, 3})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_BWD_PIPE", std::to_string(v)}}).hopper_bwd_pipe.get(), v);
  for (const char* bad : {"4", "-1", "on"})
    expect_rejected(parse({{"FLASHPORT_HOPPER_BWD_PIPE", bad}}).hopper_bwd_pipe, "FLASHPORT_HOPPER_BWD_PIPE",
                    bad);
  for (int v : {0, 1, 2})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_BWD_KEYS_OUTER", std::to_string(v)}}).hopper_bwd_keys_outer.get(), v);
  for (const char* bad : {"3", "-1", "on"})
    expect_rejected(parse({{"FLASHPORT_HOPPER_BWD_KEYS_OUTER", bad}}).hopper_bwd_keys_outer,
                    "FLASHPORT_HOPPER_BWD_KEYS_OUTER", bad);
  EXPECT_EQ(parse({}).hopper_bwd_dq_rows.get(), -1);
  for (int v : {0, 1})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_BWD_DQ_ROWS", std::to_string(v)}}).hopper_bwd_dq_rows.get(), v);
  for (const char* bad : {"2", "-1", "rows"})
    expect_rejected(parse({{"FLASHPORT_HOPPER_BWD_DQ_ROWS", bad}}).hopper_bwd_dq_rows,
                    "FLASHPORT_HOPPER_BWD_DQ_ROWS", bad);
  for (int v : {0, 1})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_BWD_ORDER", std::to_string(v)}}).hopper_bwd_order.get(), v);
  for (const char* bad : {"2", "-1", "fa3"})
    expect_rejected(parse({{"FLASHPORT_HOPPER_BWD_ORDER", bad}}).hopper_bwd_order,
                    "FLASHPORT_HOPPER_BWD_ORDER", bad);
  for (int v : {64, 128})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_BWD_BLOCK_M", std::to_string(v)}}).hopper_bwd_block_m.get(), v);
  for (const char* bad : {"32", "0", "-1", "128 "})
    expect_rejected(parse({{"FLASHPORT_HOPPER_BWD_BLOCK_M", bad}}).hopper_bwd_block_m,
                    "FLASHPORT_HOPPER_BWD_BLOCK_M", bad);
  {
    const auto fp8 = parse({{"FLASHPORT_HOPPER_FP8_TILE", "64:128:3,128:128:3:1"}}).hopper_fp8_tile.get();
    ASSERT_EQ(fp8.size(), 2u);
    EXPECT_EQ(fp8[0].stages, 3);
    EXPECT_EQ(fp8[1].stages, 3);
    EXPECT_EQ(fp8[1].exp_emu, 1);
    expect_rejected(parse({{"FLASHPORT_HOPPER_FP8_TILE", "64:256"}}).hopper_fp8_tile,
                    "FLASHPORT_HOPPER_FP8_TILE", "64:256");
  }
  for (const char* bad : {"3", "-1", "x", "1 ", "+1"})
    expect_rejected(parse({{"FLASHPORT_HOPPER_PERSISTENT", bad}}).hopper_persistent,
                    "FLASHPORT_HOPPER_PERSISTENT", bad);
  for (int v : {0, 16, 256})
    EXPECT_EQ(parse({{"FLASHPORT_HOPPER_PAGED_GATHER", std::to_string(v)}}).hopper_paged_gather.get(), v);
  for (const char* bad : {"257", "-1", "all"})
    expect_rejected(parse({{"FLASHPORT_HOPPER_PAGED_GATHER", bad}}).hopper_paged_gather,
                    "FLASHPORT_HOPPER_PAGED_GATHER", bad);
  for (const char* bad : {"4", "-1", "two", "1.0"})
    expect_rejected(parse({{"FLASHPORT_BWD_PIPE", bad}}).bwd_pipe, "FLASHPORT_BWD_PIPE", bad);
  for (const char* bad : {"0", "3", "2x"})
    expect_rejected(parse({{"FLASHPORT_BWD_STAGES", bad}}).bwd_stages, "FLASHPORT_BWD_STAGES", bad);
}

TEST(Tuning, BackwardTile) {
  const BwdTileSetting t = parse({{"FLASHPORT_BWD_TILE", "64,128,8"}}).bwd_tile.get();
  EXPECT_EQ(t.block_m, 64);
  EXPECT_EQ(t.block_n, 128);
  EXPECT_EQ(t.warps, 8);
  EXPECT_EQ(parse({{"FLASHPORT_BWD_TILE", "32,32,4"}}).bwd_tile.get().warps, 4);
  for (const char* bad : {"64,128", "64,128,8,1", "60,128,8", "64,120,8", "64,128,6", "0,128,8", "64;128;8",
                          "64,128,8,", "a,b,c", "-64,128,8"})
    expect_rejected(parse({{"FLASHPORT_BWD_TILE", bad}}).bwd_tile, "FLASHPORT_BWD_TILE", bad);
}

TEST(Tuning, HopperTile) {
  const auto entries =
      parse({{"FLASHPORT_HOPPER_TILE", "64:192:2,128:176:2:1,64:128:2:0:192"}}).hopper_tile.get();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].block_m, 0);  // the kernel's default
  EXPECT_EQ(entries[2].block_n, 128);
  EXPECT_EQ(entries[2].block_m, 192);
  EXPECT_EQ(entries[0].d, 64);
  EXPECT_EQ(entries[0].block_n, 192);
  EXPECT_EQ(entries[0].stages, 2);
  EXPECT_EQ(entries[0].exp_emu, 0);
  EXPECT_EQ(entries[1].d, 128);
  EXPECT_EQ(entries[1].exp_emu, 1);
  // Syntax only: whether a shape fits the kernel is the Hopper launcher's check.
  for (const char* bad : {"64:192", "64:192:2:0:1:5", "64-192-2", "64:192:2,", "64:x:2"}) {
    const Knob<std::vector<HopperTileSetting>> k = parse({{"FLASHPORT_HOPPER_TILE", bad}}).hopper_tile;
    EXPECT_THROW(k.get(), Error) << bad;
    try {
      k.get();
    } catch (const Error& e) {
      EXPECT_EQ(e.argument(), "FLASHPORT_HOPPER_TILE");
    }
  }
}

TEST(Tuning, PathsAndForeignVariables) {
  const Tuning t = parse({{"FLASHPORT_NVRTC_PATH", "/opt/nvrtc/libnvrtc.so.13"}, {"CUDA_HOME", "/opt/cuda"}});
  EXPECT_EQ(t.nvrtc_path.get(), "/opt/nvrtc/libnvrtc.so.13");
  EXPECT_EQ(t.cuda_home, "/opt/cuda");
  EXPECT_EQ(t.cuda_path, "");
}

TEST(Tuning, CacheDirectory) {
  EXPECT_EQ(
      cache_dir_setting(lookup({{"FLASHPORT_CACHE_DIR", "/c"}, {"XDG_CACHE_HOME", "/x"}, {"HOME", "/h"}})),
      "/c");
  EXPECT_EQ(
      cache_dir_setting(lookup({{"FLASHPORT_CACHE_DIR", ""}, {"XDG_CACHE_HOME", "/x"}, {"HOME", "/h"}})),
      "/x/flashport");
  EXPECT_EQ(cache_dir_setting(lookup({{"HOME", "/h"}})), "/h/.cache/flashport");
}

TEST(Tuning, CacheCap) {
  EXPECT_EQ(cache_max_mb_setting(lookup({}), 1024).get(), 1024u);
  EXPECT_EQ(cache_max_mb_setting(lookup({{"FLASHPORT_CACHE_MAX_MB", ""}}), 1024).get(), 1024u);
  EXPECT_EQ(cache_max_mb_setting(lookup({{"FLASHPORT_CACHE_MAX_MB", "0"}}), 1024).get(), 0u);
  EXPECT_EQ(cache_max_mb_setting(lookup({{"FLASHPORT_CACHE_MAX_MB", "300"}}), 1024).get(), 300u);
  for (const char* bad : {"2GB", "-1", "1.5", " 12", "17592186044416"})
    expect_rejected(cache_max_mb_setting(lookup({{"FLASHPORT_CACHE_MAX_MB", bad}}), 1024),
                    "FLASHPORT_CACHE_MAX_MB", bad);
}

TEST(Tuning, CpuIsa) {
  for (const char* isa : {"amx", "avx512", "avx2", "base"})
    EXPECT_EQ(cpu_isa_setting(lookup({{"FLASHPORT_CPU_ISA", isa}})).get(), isa);
  EXPECT_EQ(cpu_isa_setting(lookup({})).get(), "");
  for (const char* bad : {"AVX2", "sse", "avx-512"})
    expect_rejected(cpu_isa_setting(lookup({{"FLASHPORT_CPU_ISA", bad}})), "FLASHPORT_CPU_ISA", bad);
}

TEST(Tuning, ProcessEnvironmentParsesWithoutThrowing) {
  EXPECT_NO_THROW(tuning());
  EXPECT_EQ(&tuning(), &tuning());  // parsed once
}

}  // namespace
}  // namespace flashport::core
