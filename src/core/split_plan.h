// Split-KV, the rules every GPU forward shares: which key tiles one split of a block visits (the kernels
// call it) and how many splits a call gets (FlashAttention-2's heuristic; the CUDA and HIP launchers call
// it). Embedded in the CUDA JIT for split_tiles; the host part (standard library) is compiled out there.
#pragma once

#include "semantics.h"

#if !defined(__CUDACC_RTC__) && !defined(__HIPCC_RTC__)
#include <algorithm>
#include <cmath>
#endif

namespace flashport::core {

/// The tiles split `split` of `splits` visits out of a block's `tiles`: consecutive runs of
/// ceil(n / splits) tiles in order, so the splits partition the range (late splits may be empty, e.g.
/// with more splits than tiles). Templated on the index type like covering_tiles.
template <class I>
FP_HD sem::Tiles<I> split_tiles(sem::Tiles<I> tiles, I split, I splits) {
  const I per = (tiles.end - tiles.begin + splits - 1) / splits;
  const I lo = tiles.begin + split * per, hi = lo + per;
  return {lo < tiles.end ? lo : tiles.end, hi < tiles.end ? hi : tiles.end};
}

#if !defined(__CUDACC_RTC__) && !defined(__HIPCC_RTC__)

/// The most splits a forward is cut into: the weight table of CUDA's split_combine.cu (shared memory);
/// api.cpp bounds a requested num_splits by the same 128 (flash-attn's).
inline constexpr int kMaxSplits = 128;

/// FlashAttention-2's split heuristic: with fewer CTAs than about one wave, cut the key range so the
/// grid fills the SMs, taking the smallest split count within 85% of the best wave efficiency. Fewer
/// than four key tiles are never split: the combine pass, its scratch and the second launch cost more
/// than the one or two tiles a split saves (b 1, s 128, d 64: the C++ forward's host time was 11.8 us
/// with the split, 6.3 us without, in two H200 runs). Longer key ranges (decode) split as
/// FlashAttention-2 does. `ctas`: blocks of the unsplit grid; `sm_count`: the slots they run in (SMs,
/// CUs); `key_tiles`: the units a split takes.
inline int heuristic_splits(long long ctas, int sm_count, long long key_tiles) {
  if (ctas >= 0.8 * sm_count || key_tiles < 4) return 1;
  const int max_splits = (int)std::min<long long>({kMaxSplits, sm_count, key_tiles});
  auto efficiency = [&](int s) {
    const double waves = double(ctas * s) / sm_count;
    return waves / std::ceil(waves);
  };
  // A count is only worth trying when it changes the tiles per split.
  auto eligible = [&](int s) { return s == 1 || (key_tiles + s - 1) / s != (key_tiles + s - 2) / (s - 1); };
  double best = 0.0;
  for (int s = 1; s <= max_splits; ++s)
    if (eligible(s)) best = std::max(best, efficiency(s));
  for (int s = 1; s <= max_splits; ++s)
    if (eligible(s) && efficiency(s) >= 0.85 * best) return s;
  return 1;
}

#endif

}  // namespace flashport::core
