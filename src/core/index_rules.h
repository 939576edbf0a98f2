// What makes the index tensors of an attention call valid (cu_seqlens, seqused_k / cache_seqlens,
// cache_leftpad, cache_batch_idx, block_table), as rules over one sequence at a time. The host refuses
// host-resident indices before launching (attn_validate.cpp, api.cpp); index tensors in GPU memory are
// never read on the host outside checked mode, so a small kernel (kernels/cuda/index_check.cu) runs these
// rules on the device and reports the first fault through the per-device fault record below, which the
// next call (or flashport::check_device) turns into the named error. Kernels never depend on the outcome:
// they clamp every index (problem.h), so an invalid call reads and writes nothing out of bounds.
// Self-contained like problem.h (NVRTC embeds it).
#pragma once

#include "problem.h"

namespace flashport {

/// Which rule an index tensor broke. The host's message for each lives in core/index_fault.cpp.
enum IndexFaultKind : int {
  kFaultNone = 0,
  kFaultCuQStart,       // cu_seqlens_q[0] != 0 (packed rows start at 0)
  kFaultCuQOrder,       // cu_seqlens_q decreases
  kFaultCuQLength,      // a query length exceeds max_seqlen_q
  kFaultCuQEnd,         // cu_seqlens_q[batch] != total queries
  kFaultCuKStart,       // cu_seqlens_k[0] != 0 (packed K/V only)
  kFaultCuKOrder,       // cu_seqlens_k decreases
  kFaultCuKLength,      // a key length exceeds max_seqlen_k
  kFaultCuKEnd,         // cu_seqlens_k[batch] != total keys (packed K/V only)
  kFaultSeqUsedK,       // seqused_k outside [0, key rows of the sequence]
  kFaultCacheNegative,  // cache_seqlens < 0
  kFaultCacheCapacity,  // cache_seqlens + appended tokens > cache capacity
  kFaultLeftPad,        // cache_leftpad outside [0, end of the sequence]
  kFaultBatchIdx,       // cache_batch_idx outside [0, cache rows)
  kFaultBlockTable,     // a block-table entry the sequence uses is outside [0, num_blocks)
  kFaultKinds
};

/// The call whose indices were checked: selects names (seqused_k vs cache_seqlens) in the message.
enum IndexCallKind : int { kCallForward = 0, kCallBackward = 1, kCallKvCache = 2 };

/// One fault: the broken rule, the sequence, the entry (index into the tensor, or the block-table
/// column), the offending value and the bound it broke (meaning per kind: see index_fault.cpp).
struct IndexFault {
  int kind;
  long long batch, entry, value, bound;
};

/// Published by the device, read by the host: `claim` elects the one writer (first fault wins), which
/// writes the fields and then, after a system-wide fence, `kind`; the host reads `kind` first. Lives in
/// host memory the GPU writes through (jit::fault_record), one per device.
struct FaultRecord {
  volatile int kind;
  int call;
  long long batch, entry, value, bound;
  int claim;
};

/// Kernel arguments of the index checks (CUDA index_check.cu, CDNA index_check.hpp): the call's problem
/// (only its index tensors and bounds are read), where to report (the device's FaultRecord, host memory
/// the GPU writes through), and which call it is (IndexCallKind: seqused_k vs cache_seqlens rules).
struct IndexCheckParams {
  AttnProblem p;
  FaultRecord* record;
  int call;
};

/// Tokens sequence b's keys span in the cache or page pool (left pad included): what the block table
/// must cover.
FP_HD long long cache_tokens(const AttnProblem& p, long long b) {
  if (p.seqused_k) return (long long)p.seqused_k[b] + p.seqused_k_add;
  if (p.cu_seqlens_k) return (long long)p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  return p.sk;
}

/// The first rule sequence b breaks, block-table entries aside (see block_table_fault). `kv_cache`:
/// seqused_k holds cache_seqlens (before the append of seqused_k_add tokens, capacity p.sk).
FP_HD IndexFault sequence_fault(const AttnProblem& p, long long b, bool kv_cache) {
  using i64 = long long;
  const i64 last = p.batch - 1;
  if (const int* cu = p.cu_seqlens_q) {
    if (b == 0 && cu[0] != 0) return {kFaultCuQStart, b, 0, cu[0], 0};
    const i64 len = (i64)cu[b + 1] - cu[b];
    if (len < 0) return {kFaultCuQOrder, b, b + 1, cu[b + 1], cu[b]};
    if (len > p.sq) return {kFaultCuQLength, b, b + 1, len, p.sq};
    if (b == last && cu[b + 1] != p.total_q) return {kFaultCuQEnd, b, b + 1, cu[b + 1], p.total_q};
  }
  i64 rows = p.sk;  // key rows sequence b occupies
  if (const int* cu = p.cu_seqlens_k) {
    const bool packed = !p.block_table;  // paged keys: only the lengths matter
    if (packed && b == 0 && cu[0] != 0) return {kFaultCuKStart, b, 0, cu[0], 0};
    rows = (i64)cu[b + 1] - cu[b];
    if (rows < 0) return {kFaultCuKOrder, b, b + 1, cu[b + 1], cu[b]};
    if (rows > p.sk) return {kFaultCuKLength, b, b + 1, rows, p.sk};
    if (packed && b == last && cu[b + 1] != p.total_k) return {kFaultCuKEnd, b, b + 1, cu[b + 1], p.total_k};
  }
  i64 end = p.sk;  // end of the sequence's keys in the cache (left pad included)
  if (const int* used = p.seqused_k) {
    const i64 u = used[b];
    if (kv_cache) {
      if (u < 0) return {kFaultCacheNegative, b, b, u, 0};
      if (u + p.seqused_k_add > p.sk) return {kFaultCacheCapacity, b, b, u, p.sk};
    } else if (u < 0 || u > rows) {
      return {kFaultSeqUsedK, b, b, u, rows};
    }
    end = u + p.seqused_k_add;
  }
  if (p.leftpad_k) {
    const i64 pad = p.leftpad_k[b];
    if (pad < 0 || pad > end) return {kFaultLeftPad, b, b, pad, end};
  }
  if (p.kv_batch_idx) {
    const i64 row = p.kv_batch_idx[b];
    if (row < 0 || row >= p.kv_rows) return {kFaultBatchIdx, b, b, row, p.kv_rows};
  }
  return {kFaultNone, b, 0, 0, 0};
}

/// Block-table entries sequence b uses: [0, block_table_columns(p, b)). Call only when
/// sequence_fault(p, b) found nothing (the token count is then in [0, p.sk]).
FP_HD long long block_table_columns(const AttnProblem& p, long long b) {
  return (cache_tokens(p, b) + p.page_size - 1) / p.page_size;
}

/// The fault of block-table entry (b, column), if its page id is outside the pool.
FP_HD IndexFault block_table_fault(const AttnProblem& p, long long b, long long column) {
  const long long page = p.block_table[b * p.block_table_stride + column];
  if (page < 0 || page >= p.kv_rows) return {kFaultBlockTable, b, column, page, p.kv_rows};
  return {kFaultNone, b, 0, 0, 0};
}

}  // namespace flashport
