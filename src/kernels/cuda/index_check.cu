// index_check: runs the index rules of core/index_rules.h over every sequence of a call on the device
// and reports the first fault found to the host (see index_rules.h for why and how). Read-only on the
// call's tensors; launched on the call's stream just before its kernels, so CUDA-graph capture records
// it with them.
#include "cuda/common/common.cuh"
#include "cuda/index_check_params.cuh"
#include "cuda/index_report.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {

constexpr int kWarps = 4;                                   // one warp per sequence (per column chunk)
constexpr int kColumnsPerWarp = kIndexCheckColumnsPerWarp;  // report_block_table_chunk's chunk

}  // namespace

/// Grid x: ceil(batch / kWarps), y: block-table column chunks (1 without a block table), block
/// 32 * kWarps. Warp w checks sequence blockIdx.x * kWarps + w: its scalar rules (reported by the y = 0
/// warp only), then (when they hold, so the token count is bounded) its chunks of block-table entries,
/// kColumnsPerWarp at a time, reporting the lowest bad column of the first chunk that has one
/// (report_block_table_chunk: one load round trip per chunk, where one warp walking 8k entries 32 at a time
/// took 100 us).
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    index_check(const __grid_constant__ IndexCheckParams ip) {
  order_after_prior_grids();
  const AttnProblem& p = ip.p;
  const i64 b = block_x() * kWarps + warp_id();
  if (b >= p.batch) return;
  const int lane = lane_id();
  const IndexFault f = sequence_fault(p, b, ip.call == kCallKvCache);
  if (f.kind != kFaultNone) {
    if (lane == 0 && blockIdx.y == 0) report_fault(ip.record, ip.call, f);
    return;
  }
  if (!p.block_table) return;
  const i64 columns = block_table_columns(p, b);
  for (i64 c0 = (i64)blockIdx.y * kColumnsPerWarp; c0 < columns; c0 += (i64)gridDim.y * kColumnsPerWarp)
    if (report_block_table_chunk(ip.record, ip.call, p, b, c0, columns, lane)) return;
}
