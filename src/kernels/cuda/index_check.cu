// index_check: runs the index rules of core/index_rules.h over every sequence of a call on the device
// and reports the first fault found to the host (see index_rules.h for why and how). Read-only on the
// call's tensors; launched on the call's stream just before its kernels, so CUDA-graph capture records
// it with them.
#include "cuda/common/common.cuh"
#include "cuda/index_check_params.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {

constexpr int kWarps = 4;  // one warp per sequence

/// Publishes `f` unless another fault was published first: the claim elects one writer, whose fields
/// are visible to the host before `kind` (the host reads `kind` first).
FP_DEV void report(FaultRecord* record, int call, const IndexFault& f) {
  if (atomicCAS(&record->claim, 0, 1) != 0) return;
  record->call = call;
  record->batch = f.batch, record->entry = f.entry, record->value = f.value, record->bound = f.bound;
  __threadfence_system();
  record->kind = f.kind;
}

}  // namespace

/// Grid x: ceil(batch / kWarps), block 32 * kWarps. Warp w checks sequence blockIdx.x * kWarps + w:
/// its scalar rules, then (when they hold, so the token count is bounded) the block-table entries it
/// uses, 32 at a time, reporting the lowest bad column.
extern "C" __global__ void __launch_bounds__(32 * kWarps)
    index_check(const __grid_constant__ IndexCheckParams ip) {
  const AttnProblem& p = ip.p;
  const i64 b = block_x() * kWarps + warp_id();
  if (b >= p.batch) return;
  const int lane = lane_id();
  const IndexFault f = sequence_fault(p, b, ip.call == kCallKvCache);
  if (f.kind != kFaultNone) {
    if (lane == 0) report(ip.record, ip.call, f);
    return;
  }
  if (!p.block_table) return;
  const i64 columns = block_table_columns(p, b);
  for (i64 c0 = 0; c0 < columns; c0 += 32) {
    const i64 c = c0 + lane;
    const IndexFault e = c < columns ? block_table_fault(p, b, c) : IndexFault{kFaultNone, b, 0, 0, 0};
    const u32 bad = __ballot_sync(0xffffffffu, e.kind != kFaultNone);
    if (bad) {
      if (lane == __ffs(bad) - 1) report(ip.record, ip.call, e);
      return;
    }
  }
}
