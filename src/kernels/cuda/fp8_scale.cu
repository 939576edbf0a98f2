// The fp8 backward's two elementwise passes (backends/cuda/backward.cpp, launch_backward_fp8): q, k, v
// dequantised (x = x8 * descale, into the output dtype) before the 16/32-bit backward runs on them, and
// its gradients dL/dx turned into dL/dx8 = descale * dL/dx in place after it (SPEC "Backward", fp8).
#include "cuda/common/common.cuh"
#include "cuda/fp8_decode.cuh"
#include "cuda/fp8_scale_params.cuh"

using namespace flashport;
using namespace flashport::cuda;

namespace {
constexpr int kThreads = 128;  // one (row, head) vector per thread
}

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

/// Grid x: ceil(batch * rows * heads / kThreads), kThreads threads.
extern "C" __global__ void __launch_bounds__(kThreads) fp8_scale(const __grid_constant__ Fp8ScaleParams prm) {
  const i64 vec = block_x() * kThreads + (i64)threadIdx.x;
  if (vec >= prm.batch * prm.rows * prm.heads) return;
  const i64 h = vec % prm.heads, r = (vec / prm.heads) % prm.rows, bb = vec / (prm.heads * prm.rows);
  const AttnProblem& p = prm.p;
  const int* cu = prm.which == 0 ? p.cu_seqlens_q : p.cu_seqlens_k;
  const i64 b = cu ? sequence_of_row(cu, p.batch, r) : bb;
  const i64 hk = prm.which == 0 ? kv_head(p, h) : h;
  const float s = descale(p, prm.which, b, hk);
  const i64 src = bb * prm.src.batch_stride + r * prm.src.row_stride + h * prm.src.head_stride;
  const i64 dst = bb * prm.dst.batch_stride + r * prm.dst.row_stride + h * prm.dst.head_stride;
  const bool fp8 = is_fp8_elem(prm.src_type);
  const Fp8Decode dec = fp8_decode(prm.src_type);
  for (i64 c = 0; c < prm.cols; ++c) {
    const float x = fp8 ? u32_as_float(fp8_to_bf16(static_cast<const u8*>(prm.src.ptr)[src + c], dec) << 16)
                        : load_as(prm.src.ptr, prm.src_type, src + c);
    store_as(prm.dst.ptr, prm.dst_type, dst + c, x * s);
  }
}
