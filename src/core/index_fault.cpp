// Messages of device-reported index faults; the rules themselves are in index_rules.h.
#include "core/index_fault.hpp"

#include <algorithm>
#include <atomic>

#include "core/tuning.hpp"
#include "flashport/attention.hpp"
#include "flashport/error.hpp"

namespace flashport::core {
namespace {

std::string num(long long v) {
  return std::to_string(v);
}

const char* call_name(int call) {
  switch (call) {
    case kCallBackward:
      return "backward";
    case kCallKvCache:
      return "forward_kvcache (flash_attn_with_kvcache)";
    default:
      return "forward";
  }
}

}  // namespace

FaultText describe_fault(const IndexFault& f, int call) {
  const std::string at = " at index " + num(f.entry);
  const std::string entry = "entry " + num(f.entry) + " = " + num(f.value);
  switch (f.kind) {
    case kFaultCuQStart:
      return {"cu_seqlens_q", "must start at 0, got " + num(f.value)};
    case kFaultCuKStart:
      return {"cu_seqlens_k", "must start at 0, got " + num(f.value)};
    case kFaultCuQOrder:
    case kFaultCuKOrder:
      return {f.kind == kFaultCuQOrder ? "cu_seqlens_q" : "cu_seqlens_k",
              "must be non-decreasing (sequence lengths are differences, never negative), got " +
                  num(f.bound) + " then " + num(f.value) + at};
    case kFaultCuQLength:
    case kFaultCuKLength:
      return {f.kind == kFaultCuQLength ? "max_seqlen_q" : "max_seqlen_k",
              "is an upper bound of the lengths, but sequence " + num(f.batch) + " has length " +
                  num(f.value) + " > " + num(f.bound)};
    case kFaultCuQEnd:
    case kFaultCuKEnd:
      return {f.kind == kFaultCuQEnd ? "cu_seqlens_q" : "cu_seqlens_k",
              "must end at the total token count " + num(f.bound) + ", got " + num(f.value)};
    case kFaultSeqUsedK:
      return {"seqused_k", entry + " is outside [0, " + num(f.bound) + "]"};
    case kFaultCacheNegative:
      return {"cache_seqlens", entry + " must be >= 0"};
    case kFaultCacheCapacity:
      return {"cache_seqlens", entry + " plus the new tokens exceeds the cache capacity " + num(f.bound) +
                                   " (k_cache.shape[1], or block_table.shape[1] * page_size when paged)"};
    case kFaultLeftPad:
      return {"cache_leftpad", entry + " is outside [0, " + num(f.bound) + "]"};
    case kFaultBatchIdx:
      return {"cache_batch_idx", entry + " is outside [0, " + num(f.bound) + ")"};
    case kFaultBlockTable:
      return {"block_table", "entry [" + num(f.batch) + ", " + num(f.entry) + "] = " + num(f.value) +
                                 " is outside [0, num_blocks = " + num(f.bound) + ")"};
    default:
      return {"device fault record", "unknown fault kind " + num(f.kind) + " in " + call_name(call)};
  }
}

void raise_recorded_fault(FaultRecord* record, const std::string& device_label) {
  if (!record || record->kind == kFaultNone) [[likely]]
    return;
  std::atomic_thread_fence(std::memory_order_acquire);  // the fields were written before `kind`
  const IndexFault f{record->kind, record->batch, record->entry, record->value, record->bound};
  const int call = record->call;
  record->kind = kFaultNone;
  std::atomic_thread_fence(std::memory_order_release);
  record->claim = 0;  // last: a kernel reporting now waits for a clean record
  const FaultText t = describe_fault(f, call);
  throw Error(t.argument, t.message + " (found on " + device_label + " by an earlier " + call_name(call) +
                              " call, whose results are unreliable; this call did not run)");
}

bool wants_device_check(const AttnProblem& p) {
  const bool indices =
      p.cu_seqlens_q || p.cu_seqlens_k || p.seqused_k || p.leftpad_k || p.kv_batch_idx || p.block_table;
  return p.batch > 0 && indices && !flashport::checked_mode() && tuning().device_checks.get();
}

long long index_check_chunks(const AttnProblem& p, long long columns_per_group, long long max_grid_y) {
  if (!p.block_table || p.page_size <= 0) return 1;
  const long long columns = (p.sk + p.page_size - 1) / p.page_size;
  return std::clamp<long long>((columns + columns_per_group - 1) / columns_per_group, 1, max_grid_y);
}

}  // namespace flashport::core
