// merge_states: combines two partial attention states over disjoint key sets by their LSE.
#include "core/merge.h"
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
  order_after_prior_grids();
  const i64 row = block_x() * kWarps + warp_id();
  if (row >= mp.batch * mp.heads * mp.seqlen) return;
  const int lane = lane_id();
  const MergeRow r = merge_row(mp, row);  // reads both LSEs: lane 0 may overwrite them below
  merge_channels(mp, r, lane, 32);
  __syncwarp();
  if (mp.lse && lane == 0) mp.lse[row] = r.lse;
}
