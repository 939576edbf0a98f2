// The Hopper forward's causal persistent schedule (hopper/fwd_sm90_config.h), host only: the order in
// which persistent CTAs take query blocks must cover every (query block, head pair) exactly once, keep
// each section's pairs together and, within a section, deal heavier blocks (more keys) first.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "kernels/cuda/hopper/fwd_sm90_config.h"

namespace flashport::cuda::hopper {
namespace {

void expect_schedule(int m_blocks, int pairs, int section) {
  SCOPED_TRACE(testing::Message() << "m_blocks " << m_blocks << " pairs " << pairs << " section " << section);
  std::vector<int> seen((size_t)m_blocks * pairs, 0);
  int prev_section = 0, prev_block = m_blocks;
  for (int t = 0; t < m_blocks * pairs; ++t) {
    const CausalTile c = causal_tile(t, m_blocks, pairs, section);
    ASSERT_GE(c.m_block, 0);
    ASSERT_LT(c.m_block, m_blocks);
    ASSERT_GE(c.pair, 0);
    ASSERT_LT(c.pair, pairs);
    ++seen[(size_t)c.pair * m_blocks + c.m_block];
    const int sec = c.pair / section;
    ASSERT_GE(sec, prev_section) << "tile " << t << " went back to an earlier section";
    if (sec == prev_section) {
      ASSERT_LE(c.m_block, prev_block) << "tile " << t << ": a heavier block after a lighter one";
    }
    prev_section = sec, prev_block = c.m_block;
  }
  for (size_t i = 0; i < seen.size(); ++i)
    ASSERT_EQ(seen[i], 1) << "pair " << i / m_blocks << " block " << i % m_blocks;
}

TEST(HopperSchedule, CausalTilesCoverEveryBlockOnceHeaviestFirstPerSection) {
  expect_schedule(1, 1, 1);
  expect_schedule(16, 128, 32);  // b 8 x 2k, 16 heads, d 128: four sections
  expect_schedule(7, 10, 3);     // a shorter last section
  expect_schedule(5, 4, 4);      // one section: all pairs
  std::mt19937 rng(20261204);
  for (int i = 0; i < 300; ++i) {
    const int m_blocks = 1 + (int)(rng() % 40), pairs = 1 + (int)(rng() % 60);
    expect_schedule(m_blocks, pairs, 1 + (int)(rng() % pairs));
  }
}

TEST(HopperSchedule, SectionsHoldTheKvHeadsThatFitL2) {
  // d 128 at 2k keys (16 query blocks): 1 MB of K and V per kv head, 32 per section; GQA keeps whole groups.
  EXPECT_EQ(causal_section(2048, 128, 128, 1, 128, 132, 16), 32);
  EXPECT_EQ(causal_section(2048, 128, 128, 4, 128, 132, 16), 128);
  EXPECT_EQ(causal_section(2048, 128, 128, 1, 20, 132, 16), 20);  // all pairs fit
  // 16k keys: 8 MB per kv head, 4 per section (512 blocks); past 32 MB one kv head's group.
  EXPECT_EQ(causal_section(16384, 128, 128, 1, 64, 132, 128), 4);
  EXPECT_EQ(causal_section(1 << 20, 128, 128, 8, 64, 132, 8192), 8);
  EXPECT_EQ(causal_section(0, 64, 64, 2, 6, 6, 1), 6);     // no keys: still a block per CTA
  EXPECT_EQ(causal_section(2048, 64, 64, 1, 0, 1, 1), 1);  // no pairs: still a divisor
  // Few query blocks per head: a section gives every CTA a block even past the L2 budget.
  EXPECT_EQ(causal_section(70000, 64, 64, 1, 400, 132, 2), 66);   // 1 kv head fits; 66 x 2 blocks
  EXPECT_EQ(causal_section(70000, 64, 64, 4, 400, 132, 2), 68);   // whole groups of 4
  EXPECT_EQ(causal_section(1024, 64, 64, 1, 256, 132, 1), 132);   // tests/gpu CausalSections' d 64
  EXPECT_EQ(causal_section(256, 128, 128, 1, 512, 132, 2), 256);  // and its d 128
}

// The FP8 kernel's V^T key order against the e4m3 A-operand layout (wgmma m64nNk32, per warp m16n8k32's):
// thread t's register r holds columns 16 (r / 2) + 4t + i, i = 0..3, and convert_p fills it with the
// thread's own accumulator pairs (keys 8j + 2t, 8j + 2t + 1) of 8-key groups j = 2 (r / 2) and 2 (r / 2) + 1.
TEST(HopperSchedule, Fp8KeyOrderMatchesThePRegisters) {
  std::vector<int> seen(32, 0);
  for (int slot = 0; slot < 32; ++slot) {
    const int key = fp8_key_of_slot(slot);
    ASSERT_TRUE(key >= 0 && key < 32) << slot;
    ++seen[key];
  }
  for (int key = 0; key < 32; ++key) EXPECT_EQ(seen[key], 1) << "key " << key;
  for (int t = 0; t < 4; ++t)
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < 4; ++i) {
        const int slot = 16 * (r / 2) + 4 * t + i, group = 2 * (r / 2) + i / 2;
        EXPECT_EQ(fp8_key_of_slot(slot), 8 * group + 2 * t + i % 2) << "t " << t << " r " << r << " i " << i;
      }
}

// The FP8 forward's V^T slots for varlen batches: each sequence's region (its keys rounded up to whole
// 128-key blocks, which the V^T pass writes and the forward reads) starts at a multiple of 128, after the
// previous one's end, and ends within fp8_vt_keys: regions never overlap, and the scratch follows total_k.
TEST(HopperSchedule, Fp8VtRegionsAreDisjointAndBounded) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + (int)(gen() % 12);
    std::vector<int> cu(batch + 1, 0);
    int longest = 0;
    for (int b = 0; b < batch; ++b) {
      const int len = gen() % 3 == 0 ? 0 : (int)(gen() % 700);
      cu[b + 1] = cu[b] + len;
      longest = std::max(longest, len);
    }
    AttnProblem p{};
    p.batch = batch, p.sk = longest, p.total_k = cu[batch];
    p.cu_seqlens_k = cu.data();
    long long end = 0;
    for (int b = 0; b < batch; ++b) {
      const long long start = fp8_vt_start(p, b), len = cu[b + 1] - cu[b];
      const long long rounded = (len + kFp8VtKeys - 1) / kFp8VtKeys * kFp8VtKeys;
      EXPECT_EQ(start % kFp8VtKeys, 0);
      EXPECT_GE(start, end) << "sequence " << b << " overlaps the previous one";
      end = start + rounded;
      EXPECT_LE(end, fp8_vt_keys(p)) << "sequence " << b;
    }
    EXPECT_LE(fp8_vt_keys(p), p.total_k + kFp8VtKeys * (batch + 2) + p.sk);
  }
}

}  // namespace
}  // namespace flashport::cuda::hopper
