// merge_states: combines two partial attention states over disjoint key sets by their LSE.
#include "core/problem.h"
#include "cuda/common/common.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {
constexpr int kWarps = 4;  // one warp per row (b, s, h)
}

/// Grid x: ceil(batch * heads * seqlen / kWarps), block 32 * kWarps. Row r = (b * heads + h) * seqlen
/// + s indexes the LSEs. Arithmetic in fp64 like the CPU reference; a state of weight 0 (LSE -inf) is
/// never read, so its unwritten output cannot leak NaN. Every lane reads both LSEs before lane 0
/// writes the merged one (they may alias); each output element is read and written by one thread.
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    merge_states(const __grid_constant__ MergeParams mp) {
  const i64 row = block_x() * kWarps + warp_id();
  if (row >= mp.batch * mp.heads * mp.seqlen) return;
  const int lane = lane_id();
  const i64 s = row % mp.seqlen, h = (row / mp.seqlen) % mp.heads, b = row / (mp.seqlen * mp.heads);
  const double lse_a = mp.lse_a[row], lse_b = mp.lse_b[row];
  const double m = lse_a > lse_b ? lse_a : lse_b;
  const double w_a = sem::lse_weight(lse_a, m), w_b = sem::lse_weight(lse_b, m);
  const double w_sum = w_a + w_b;
  const i64 a_off = b * mp.a.batch_stride + s * mp.a.row_stride + h * mp.a.head_stride;
  const i64 b_off = b * mp.b.batch_stride + s * mp.b.row_stride + h * mp.b.head_stride;
  const i64 o_off = b * mp.out.batch_stride + s * mp.out.row_stride + h * mp.out.head_stride;
  for (i64 c = lane; c < mp.d; c += 32) {
    double merged = 0.0;
    if (w_a > 0.0) merged += w_a * load_as_f64(mp.a.ptr, mp.type, a_off + c);
    if (w_b > 0.0) merged += w_b * load_as_f64(mp.b.ptr, mp.type, b_off + c);
    store_as_f64(mp.out.ptr, mp.type, o_off + c, w_sum > 0.0 ? merged / w_sum : 0.0);
  }
  __syncwarp();
  if (mp.lse && lane == 0)
    mp.lse[row] = w_sum > 0.0 ? (float)(m + log(w_sum)) : -__builtin_bit_cast(float, 0x7f800000u);
}
