// Kernel arguments of the CUDA forward and split-combine kernels; shared by host launcher and NVRTC.
#pragma once

#include "core/index_rules.h"

namespace flashport::cuda {

/// Bits of FwdParams::vec: the operand rows are 16-byte aligned (pointer and every stride a
/// multiple of 8 elements), so cp.async / 16-byte stores may be used. Otherwise a scalar path runs.
enum VecFlags : int { kVecQ = 1, kVecK = 2, kVecV = 4, kVecO = 8 };

/// Forward launch arguments. With `num_splits > 1` the key range is cut into splits (grid z is
/// batch * num_splits, batch_offset 0) and each split writes its normalised fp32 partial output and LSE to
/// the workspace instead of p.o / p.lse; split_combine.cu merges them. Splits need dense queries.
struct FwdParams {
  AttnProblem p;
  float* o_partial;        // (num_splits, batch, hq, sq, dv) fp32, or null without splits
  float* lse_partial;      // (num_splits, batch, hq, sq) fp32
  long long batch_offset;  // sequence index of grid z = 0 (batches beyond grid z's 65535 limit)
  int num_splits;          // >= 1
  int pack_gqa;            // 1, or hq / hk: a block's rows are (query, head of the kv head's group) pairs
                           // and grid y runs over kv heads (see RowMap in attn_fwd.cuh)
  int vec;                 // VecFlags
  // The decode variant's own index check (kvcache calls, report_decode_faults; backends/cuda/
  // index_check.hpp): the device's fault record, or null for none, and the IndexCallKind it reports as.
  FaultRecord* fault_record;
  int fault_call;
};

}  // namespace flashport::cuda
