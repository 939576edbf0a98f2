// The tile-range helpers of core/semantics.h (tile_keys, keys_seen_by_all, seeing_queries, covering_tiles),
// which every tiled path uses to skip work, against the per-element rule sem::is_visible by brute force: each
// range must be exact, since a range too small drops visible scores and one too large costs masked tiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "core/semantics.h"

namespace flashport {
namespace {

using sem::i64;

struct Shape {
  i64 sq, sk, wl, wr;
};

/// Random lengths (sq > sk, sq < sk, empty keys) and masks: none, causal, sliding windows on either side
/// (some wider than the sequences).
Shape random_shape(std::mt19937& rng) {
  auto pick = [&](i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng); };
  Shape s{pick(1, 70), pick(0, 70), -1, -1};
  const i64 kind = pick(0, 4);                            // 0: unmasked
  if (kind == 1) s.wr = 0;                                // causal
  if (kind == 2) s.wl = pick(0, 80), s.wr = 0;            // causal sliding window
  if (kind == 3) s.wl = pick(0, 80), s.wr = pick(0, 80);  // two-sided window
  if (kind == 4) s.wl = pick(-1, 10), s.wr = pick(-1, 10);
  return s;
}

bool visible(const Shape& s, i64 i, i64 j) {
  return sem::is_visible(i, j, s.sq, s.sk, s.wl, s.wr);
}

/// Brute-force union of the visible keys of rows [i0, i1): {min, max + 1}, or empty {0, 0}.
sem::Range union_keys(const Shape& s, i64 i0, i64 i1) {
  sem::Range r{s.sk, 0};
  for (i64 i = i0; i < i1; ++i) {
    for (i64 j = 0; j < s.sk; ++j) {
      if (visible(s, i, j)) r.lo = std::min(r.lo, j), r.hi = std::max(r.hi, j + 1);
    }
  }
  return r.lo < r.hi ? r : sem::Range{0, 0};
}

/// Brute-force queries that see a key of [j0, j1).
sem::Range union_queries(const Shape& s, i64 j0, i64 j1) {
  sem::Range r{s.sq, 0};
  for (i64 i = 0; i < s.sq; ++i) {
    for (i64 j = j0; j < j1; ++j) {
      if (visible(s, i, j)) r.lo = std::min(r.lo, i), r.hi = std::max(r.hi, i + 1);
    }
  }
  return r.lo < r.hi ? r : sem::Range{0, 0};
}

std::string describe(const Shape& s) {
  return "sq " + std::to_string(s.sq) + " sk " + std::to_string(s.sk) + " wl " + std::to_string(s.wl) +
         " wr " + std::to_string(s.wr);
}

/// `got` equals the brute-force range `want` when that is non-empty, and is empty when it is.
void expect_exact(const sem::Range& want, const sem::Range& got, const std::string& what) {
  if (want.lo < want.hi) {
    EXPECT_EQ(got.lo, want.lo) << what;
    EXPECT_EQ(got.hi, want.hi) << what;
  } else {
    EXPECT_GE(got.lo, got.hi) << what << ": empty";
  }
}

TEST(TileRanges, TileKeysIsTheUnionOfTheRowsVisibleKeys) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    const Shape s = random_shape(rng);
    const i64 i0 = std::uniform_int_distribution<i64>(0, s.sq - 1)(rng);
    const i64 i1 = std::uniform_int_distribution<i64>(i0 + 1, s.sq)(rng);
    const sem::Range want = union_keys(s, i0, i1);
    const sem::Range got = sem::tile_keys(i0, i1, s.sq, s.sk, s.wl, s.wr);
    expect_exact(want, got, describe(s) + " rows [" + std::to_string(i0) + ", " + std::to_string(i1) + ")");
  }
}

TEST(TileRanges, KeysSeenByAllIsTheIntersectionOfTheRowsVisibleKeys) {
  std::mt19937 rng(5);
  int nonempty = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Shape s = random_shape(rng);
    const i64 i0 = std::uniform_int_distribution<i64>(0, s.sq - 1)(rng);
    const i64 i1 = std::uniform_int_distribution<i64>(i0 + 1, s.sq)(rng);
    sem::Range want{s.sk, 0};  // brute force: keys every row of [i0, i1) sees
    for (i64 j = 0; j < s.sk; ++j) {
      bool all = true;
      for (i64 i = i0; i < i1 && all; ++i) all = visible(s, i, j);
      if (all) want.lo = std::min(want.lo, j), want.hi = std::max(want.hi, j + 1);
    }
    if (want.lo >= want.hi) want = {0, 0};
    const sem::Range got = sem::keys_seen_by_all(i0, i1, s.sq, s.sk, s.wl, s.wr);
    nonempty += want.lo < want.hi;
    expect_exact(want, got, describe(s) + " rows [" + std::to_string(i0) + ", " + std::to_string(i1) + ")");
    // What the kernels ask: a tile needs no mask iff every pair in it is visible.
    const i64 j0 = std::uniform_int_distribution<i64>(0, s.sk + 4)(rng), j1 = j0 + 4;
    bool every = true;
    for (i64 i = i0; i < i1; ++i)
      for (i64 j = j0; j < j1; ++j) every = every && j < s.sk && visible(s, i, j);
    EXPECT_EQ(sem::contains(got, j0, j1), every) << describe(s) << " tile [" << j0 << ", " << j1 << ")";
  }
  EXPECT_GT(nonempty, 300) << "the shapes must exercise shared keys";
}

TEST(TileRanges, SeeingQueriesIsTheSetOfQueriesThatSeeTheKeys) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3000; ++trial) {
    Shape s = random_shape(rng);
    if (s.sk == 0) s.sk = 1;  // the callers ask only about existing keys
    const i64 j0 = std::uniform_int_distribution<i64>(0, s.sk - 1)(rng);
    const i64 j1 = std::uniform_int_distribution<i64>(j0 + 1, s.sk)(rng);
    const sem::Range want = union_queries(s, j0, j1);
    const sem::Range got = sem::seeing_queries(j0, j1, s.sq, s.sk, s.wl, s.wr);
    EXPECT_GE(got.lo, 0);
    EXPECT_LE(got.hi, s.sq);
    expect_exact(want, got, describe(s) + " keys [" + std::to_string(j0) + ", " + std::to_string(j1) + ")");
  }
}

/// The tile walks of the kernels and the CPU fast path: forward, query tile m visits key tiles
/// covering_tiles(tile_keys(...)); backward, key tile n visits query tiles covering_tiles(seeing_queries).
/// Either list must hold exactly the tiles with at least one visible (query, key) pair.
TEST(TileRanges, CoveringTilesVisitExactlyTheTilesWithAVisiblePair) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 400; ++trial) {
    const Shape s = random_shape(rng);
    const int bm = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    const int bn = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    auto any_pair = [&](i64 m, i64 n) {
      for (i64 i = m * bm; i < std::min(s.sq, (m + 1) * bm); ++i) {
        for (i64 j = n * bn; j < std::min(s.sk, (n + 1) * bn); ++j) {
          if (visible(s, i, j)) return true;
        }
      }
      return false;
    };
    const i64 n_m = (s.sq + bm - 1) / bm, n_n = (s.sk + bn - 1) / bn;
    for (i64 m = 0; m < n_m; ++m) {
      const sem::Range keys = sem::tile_keys(m * bm, std::min(s.sq, (m + 1) * bm), s.sq, s.sk, s.wl, s.wr);
      const sem::Tiles<i64> t = sem::covering_tiles<i64>(keys.lo, keys.hi, bn);
      for (i64 n = 0; n < n_n; ++n) {
        EXPECT_EQ(n >= t.begin && n < t.end, any_pair(m, n))
            << describe(s) << " bm " << bm << " bn " << bn << " query tile " << m << " key tile " << n;
      }
      EXPECT_LE(t.begin, t.end);
    }
    for (i64 n = 0; n < n_n; ++n) {
      const sem::Range qs = sem::seeing_queries(n * bn, std::min(s.sk, (n + 1) * bn), s.sq, s.sk, s.wl, s.wr);
      // 32-bit, as the backward kernels take it.
      const sem::Tiles<int> t = sem::covering_tiles<int>((int)qs.lo, (int)qs.hi, bm);
      for (i64 m = 0; m < n_m; ++m) {
        EXPECT_EQ(m >= t.begin && m < t.end, any_pair(m, n))
            << describe(s) << " bm " << bm << " bn " << bn << " key tile " << n << " query tile " << m;
      }
      EXPECT_LE(t.begin, t.end);
    }
  }
}

/// Varlen batches: each sequence's helpers see only its own lengths, so the walk over a packed batch
/// (queries at cu_q[b] + i, keys at cu_k[b] + j) covers exactly the visible pairs of every sequence.
TEST(TileRanges, VarlenSequencesEachCoverTheirVisiblePairs) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 100; ++trial) {
    const Shape mask = random_shape(rng);
    const int batch = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int b = 0; b < batch; ++b) {
      Shape s = random_shape(rng);
      s.wl = mask.wl, s.wr = mask.wr;  // one mask for the batch, as in a call
      i64 pairs = 0, walked = 0;
      for (i64 i = 0; i < s.sq; ++i) {
        for (i64 j = 0; j < s.sk; ++j) pairs += visible(s, i, j);
      }
      const int bm = 16, bn = 8;
      for (i64 m0 = 0; m0 < s.sq; m0 += bm) {
        const i64 m1 = std::min(s.sq, m0 + bm);
        const sem::Range keys = sem::tile_keys(m0, m1, s.sq, s.sk, s.wl, s.wr);
        const sem::Tiles<i64> t = sem::covering_tiles<i64>(keys.lo, keys.hi, bn);
        for (i64 n = t.begin; n < t.end; ++n) {
          for (i64 i = m0; i < m1; ++i) {
            for (i64 j = n * bn; j < std::min(s.sk, (n + 1) * bn); ++j) walked += visible(s, i, j);
          }
        }
      }
      EXPECT_EQ(walked, pairs) << describe(s);
    }
  }
}

}  // namespace
}  // namespace flashport
