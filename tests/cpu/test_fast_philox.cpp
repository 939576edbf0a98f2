// The CPU fast path's row-vectorised Philox (fast_simd.hpp philox_rows) against sem::philox4x32_10,
// which the reference and every kernel call, and against SPEC's known answers: dropout masks of the
// fast path and the reference must agree bit for bit.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>

#include "backends/cpu/fast_common.hpp"
#include "core/semantics.h"

// The baseline-target copy of the fast path's building blocks, as fast_isa_base.cpp builds them.
namespace flashport::cpu::fast::philox_test {
#define FAST_W 4
#define FAST_MR 3
#define FAST_NV 4
#include "backends/cpu/fast_simd.hpp"
#undef FAST_W
#undef FAST_MR
#undef FAST_NV
}  // namespace flashport::cpu::fast::philox_test

namespace flashport {
namespace {

using cpu::fast::kBlockQ;
using sem::u32;

/// philox_rows for counter (group, i0 + r, head, offset) against the shared Philox, every row.
void expect_rows_match(u32 group, long long i0, u32 head, u32 offset, uint64_t seed) {
  uint32_t words[4][kBlockQ];
  cpu::fast::philox_test::philox_rows(group, i0, head, offset, seed, words);
  for (int r = 0; r < kBlockQ; ++r) {
    const sem::Philox4 want =
        sem::philox4x32_10(group, (u32)(i0 + r), head, offset, (u32)seed, (u32)(seed >> 32));
    for (int w = 0; w < 4; ++w) {
      ASSERT_EQ(words[w][r], want.x[w]) << "row " << r << " word " << w << " counter (" << group << ", "
                                        << i0 + r << ", " << head << ", " << offset << ") seed " << seed;
    }
  }
}

TEST(FastPhilox, RowsMatchSpecKnownAnswers) {
  // SPEC's known answers: counter (c0..c3), key (k0, k1) -> four words. Row 0 of a tile at i0 = c1.
  struct Known {
    std::array<u32, 4> c;
    std::array<u32, 2> k;
    std::array<u32, 4> want;
  };
  const u32 ones = 0xffffffffu;
  const Known known[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{ones, ones, ones, ones}, {ones, ones}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Known& k : known) {
    uint32_t words[4][kBlockQ];
    const uint64_t seed = (uint64_t)k.k[1] << 32 | k.k[0];
    cpu::fast::philox_test::philox_rows(k.c[0], k.c[1], k.c[2], k.c[3], seed, words);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(words[w][0], k.want[w]) << "word " << w;
    expect_rows_match(k.c[0], k.c[1], k.c[2], k.c[3], seed);
  }
}

TEST(FastPhilox, RowsMatchSharedPhiloxForRandomCounters) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const uint64_t a = rng(), b = rng(), seed = rng();
    // Row counters wrap at 2^32 (i0 near the top) exactly as the (u32) cast in the shared counter.
    const long long i0 = trial % 3 == 0 ? (long long)0xffffffffu - (long long)(a % 70) : (long long)(a >> 40);
    expect_rows_match((u32)a, i0, (u32)b, (u32)(b >> 32), seed);
  }
}

}  // namespace
}  // namespace flashport
