// The fp8 backward's two elementwise passes (backends/cuda/backward.cpp, launch_backward_fp8): q, k, v
// dequantised (x = x8 * descale, into the output dtype) before the 16/32-bit backward runs on them, and
// its gradients dL/dx turned into dL/dx8 = descale * dL/dx in place after it (SPEC "Backward", fp8).
#include "cuda/common/common.cuh"
#include "cuda/fp8_decode.cuh"
#include "cuda/fp8_scale_params.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {
constexpr int kThreads = kFp8ScaleThreads;
constexpr int kChunk = kFp8ScaleChunk;
}  // namespace

/// The sequence that packed row `r` of a varlen operand belongs to: the last b with cu[b] <= r (cu
/// ascending; a malformed cu only picks another sequence's descale, never an address).
FP_DEV long long sequence_of_row(const int* cu, long long batch, long long r) {
  long long lo = 0, hi = batch - 1;
  while (lo < hi) {
    const long long mid = (lo + hi + 1) / 2;
    if ((long long)cu[mid] <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

/// Grid (ceil(largest operand's batch * rows * heads * chunks / kThreads), 3), kThreads threads: grid y
/// is the operand (0 q, 1 k, 2 v); each thread scales one kChunk-column chunk of one (row, head) vector.
extern "C" __global__ void __launch_bounds__(kThreads) fp8_scale(const __grid_constant__ Fp8ScaleParams prm) {
  order_after_prior_grids();
  const int which = (int)block_y();
  const Fp8ScaleOperand& op = prm.op[which];
  const i64 chunks = ceil_div(op.cols, kChunk);
  const i64 item = block_x() * kThreads + (i64)threadIdx.x;
  if (item >= prm.batch * op.rows * op.heads * chunks) return;
  const i64 c0 = (item % chunks) * kChunk, vec = item / chunks;
  const i64 h = vec % op.heads, r = (vec / op.heads) % op.rows, bb = vec / (op.heads * op.rows);
  const AttnProblem& p = prm.p;
  const int* cu = which == 0 ? p.cu_seqlens_q : p.cu_seqlens_k;
  const i64 b = cu ? sequence_of_row(cu, p.batch, r) : bb;
  const i64 hk = which == 0 ? kv_head(p, h) : h;
  const float s = descale(p, which, b, hk);
  const i64 src = bb * op.src.batch_stride + r * op.src.row_stride + h * op.src.head_stride;
  const i64 dst = bb * op.dst.batch_stride + r * op.dst.row_stride + h * op.dst.head_stride;
  const bool fp8 = is_fp8_elem(prm.src_type);
  const Fp8Decode dec = fp8_decode(prm.src_type);
  const i64 c1 = c0 + kChunk < op.cols ? c0 + kChunk : op.cols;
  for (i64 c = c0; c < c1; ++c) {
    const float x = fp8 ? u32_as_float(fp8_to_bf16(static_cast<const u8*>(op.src.ptr)[src + c], dec) << 16)
                        : load_as(op.src.ptr, prm.src_type, src + c);
    store_as(op.dst.ptr, prm.dst_type, dst + c, x * s);
  }
}
