// The forward stages the CUDA portable and CDNA kernels share (src/kernels/attn/fwd_stages.h), run on the
// host against brute force: which key tiles a block visits (every split of it), which keys need no mask,
// and the online softmax over tiles through a one-lane `Rows` policy against a direct softmax.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "attn/fwd_stages.h"

namespace flashport {
namespace {

using sem::i64;

AttnProblem problem(i64 sq, i64 sk, i64 wl, i64 wr, i64 hq, i64 hk) {
  AttnProblem p{};
  p.batch = 1, p.hq = hq, p.hk = hk, p.d = p.dv = 64, p.sq = sq, p.sk = sk;
  p.window_left = wl, p.window_right = wr;
  p.scale = 0.125f;
  return p;
}

// Every key a row of the block sees lies in a tile some split visits, the splits' tiles are disjoint and
// in order, and every key of `unmasked_keys` is seen by every row of the block.
TEST(AttnStages, BlockTilesCoverEveryVisibleKeyOnce) {
  std::mt19937 rng(std::random_device{}());
  const i64 windows[][2] = {{-1, -1}, {-1, 0}, {5, 3}, {0, 0}, {17, -1}, {-1, 40}};
  int blocks_checked = 0;
  for (int rep = 0; rep < 40; ++rep) {
    const i64 sq = 1 + rng() % 150, sk = 1 + rng() % 300;
    const auto& w = windows[rng() % 6];
    const i64 group = rep % 2 ? 3 : 1;
    const AttnProblem p = problem(sq, sk, w[0], w[1], 3, group == 3 ? 1 : 3);
    for (i64 block_m : {16, 64})
      for (i64 block_n : {16, 32, 64})
        for (i64 splits : {1, 3, 7}) {
          for (i64 m_block = 0; m_block * block_m < sq * group; ++m_block) {
            const attn::RowMap rows = attn::row_map(m_block, 0, group, block_m);
            const attn::FwdBlock blk = attn::fwd_block(p, 0, rows, block_m);
            ASSERT_LT(rows.m0, blk.packed_len);
            std::set<i64> visited;
            i64 prev_end = -1;
            for (i64 s = 0; s < splits; ++s) {
              const sem::Tiles<i64> t = attn::block_tiles(p, blk, block_n, s, splits);
              if (t.begin >= t.end) continue;
              EXPECT_GE(t.begin, prev_end) << "splits overlap or run backwards";
              prev_end = t.end;
              for (i64 x = t.begin; x < t.end; ++x) EXPECT_TRUE(visited.insert(x).second);
            }
            const sem::KeyRange all = attn::unmasked_keys(p, blk);
            for (i64 r = 0; r < block_m && rows.m0 + r < blk.packed_len; ++r) {
              const i64 i = rows.query(r);
              ASSERT_GE(i, blk.first);
              ASSERT_LE(i, blk.last);
              ASSERT_EQ(rows.head(r), (rows.m0 + r) % group);
              for (i64 j = 0; j < sk; ++j) {
                const bool seen = sem::is_visible(i, j, sq, sk, p.window_left, p.window_right);
                if (seen) EXPECT_TRUE(visited.count(j / block_n)) << "row " << i << " key " << j;
                if (j >= all.lo && j < all.hi) EXPECT_TRUE(seen) << "unmasked key " << j << " row " << i;
              }
            }
            ++blocks_checked;
          }
        }
  }
  EXPECT_GT(blocks_checked, 100);
}

// A host `Rows` policy: one lane holding kRows rows of kKeys scores per tile and kDim output channels.
constexpr int kRowsPerLane = 2, kKeys = 8, kDim = 4;
struct HostRows {
  static constexpr int kRows = kRowsPerLane;
  template <class F>
  static void map_s(float (&s)[kRows][kKeys], F&& f) {
    for (int r = 0; r < kRows; ++r)
      for (int j = 0; j < kKeys; ++j) s[r][j] = f(r, j, s[r][j]);
  }
  template <class F>
  static void map_o(float (&o)[kRows][kDim], F&& f) {
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kDim; ++c) o[r][c] = f(r, o[r][c]);
  }
  static float row_max(float v) { return v; }
  static float row_sum(float v) { return v; }
  static float exp2(float x) { return std::exp2(x); }
  static float log2(float x) { return std::log2(x); }
  static bool all_lanes(bool v) { return v; }
};

// transform_scores + online_softmax over several tiles + finish_rows give softmax(s) V and the LSE of a
// direct computation; a row whose keys are all masked ends with O = 0 and LSE = -inf (no NaN); tiles
// where the running max does not grow take the unit-rescale skip without changing the result.
TEST(AttnStages, OnlineSoftmaxOverTilesIsTheDirectSoftmax) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int rep = 0; rep < 20; ++rep) {
    const int tiles = 1 + (int)(rng() % 5), sk = tiles * kKeys;
    // Row 0 sees keys [lo, hi) of the sequence; row 1 sees none (a window that excludes every key).
    const i64 lo = rng() % sk, hi = lo + 1 + rng() % (sk - lo);
    AttnProblem p = problem(2, sk, -1, -1, 1, 1);
    attn::ScoreRows<kRowsPerLane> c{};
    c.scale = p.scale, c.scale_log2 = p.scale * sem::kLog2e, c.plain = true;
    c.len_q = 2, c.len_k = sk;
    c.key_lo[0] = (int)lo, c.key_hi[0] = (int)hi, c.key_lo[1] = c.key_hi[1] = 0;
    std::vector<float> dots(sk), v(sk * kDim);
    for (float& x : dots) x = rep % 4 == 0 ? 1.0f : normal(rng);  // every 4th: all equal (max never grows)
    for (float& x : v) x = normal(rng);

    attn::RowState<kRowsPerLane> st = attn::row_state_init<kRowsPerLane>();
    float o[kRowsPerLane][kDim] = {};
    for (int t = 0; t < tiles; ++t) {
      float s[kRowsPerLane][kKeys];
      for (int r = 0; r < kRowsPerLane; ++r)
        for (int j = 0; j < kKeys; ++j) s[r][j] = dots[t * kKeys + j];
      attn::transform_scores<HostRows, kKeys>(s, p, c, (i64)t * kKeys, true);
      attn::online_softmax<HostRows>(s, o, st);
      for (int r = 0; r < kRowsPerLane; ++r)
        for (int ch = 0; ch < kDim; ++ch)
          for (int j = 0; j < kKeys; ++j) o[r][ch] += s[r][j] * v[(t * kKeys + j) * kDim + ch];
    }
    float fac[kRowsPerLane], lse[kRowsPerLane];
    attn::finish_rows<HostRows>(st, attn::output_scale(p, 0, 0, false), fac, lse);

    double mx = -INFINITY, sum = 0.0;
    for (i64 j = lo; j < hi; ++j) mx = std::max(mx, (double)dots[j] * p.scale);
    for (i64 j = lo; j < hi; ++j) sum += std::exp((double)dots[j] * p.scale - mx);
    EXPECT_NEAR(lse[0], mx + std::log(sum), 1e-5 * (1 + std::fabs(mx)));
    for (int ch = 0; ch < kDim; ++ch) {
      double want = 0.0;
      for (i64 j = lo; j < hi; ++j) want += std::exp((double)dots[j] * p.scale - mx) / sum * v[j * kDim + ch];
      EXPECT_NEAR(o[0][ch] * fac[0], want, 1e-5) << "channel " << ch << ", keys [" << lo << ", " << hi << ")";
      EXPECT_EQ(o[1][ch] * fac[1], 0.0f);
    }
    EXPECT_EQ(lse[1], -INFINITY);
  }
}

}  // namespace
}  // namespace flashport
