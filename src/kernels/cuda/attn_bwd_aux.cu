// The two memory-bound kernels around the backward main loop: D = rowsum(dO * O) before it (zeroing the
// dQ accumulator on the way), and the fp32 dQ accumulator (summed over its slices in slice order) -> dq in
// the input dtype after it.
// FP_DTYPE f16 / bf16 (16-byte path where rows are aligned) or f32 (scalar path only: the fp32 backward
// main kernel, attn_bwd_f32.cu, shares these two steps).
#include "cuda/bwd_params.cuh"
#include "cuda/bwd_seq.cuh"
#include "cuda/common/common.cuh"

#ifndef FP_DTYPE
#error "attn_bwd_aux needs -D FP_DTYPE"
#endif

namespace flashport::cuda::bwd {

using Elem = FP_DTYPE;
constexpr int kAuxWarps = kBwdAuxThreads / 32;
// A CTA covers kBwdAuxRows query rows of one (head, batch entry).
constexpr int kAuxRowsPerWarp = kBwdAuxRows / kAuxWarps;

/// Query row `k` of this warp (grid x covers p.sq in steps of kBwdAuxRows).
FP_DEV int aux_row(int k) {
  return ((int)blockIdx.x * kAuxWarps + warp_id()) * kAuxRowsPerWarp + k;
}

/// The 16-byte path's split of a warp over rows: a row of `width` channels is d/8 chunks, spread over 8,
/// 16 or 32 lanes (the chunk count rounded up), so a warp takes 32 / lanes rows per pass. One lane per
/// chunk keeps all 32 lanes loading at d 64 and d 128, where a whole warp per row left 24 or 16 idle
/// and the kernel ran at a fraction of the bandwidth.
struct VecLanes {
  int lanes, rows_per_pass;
  FP_DEV explicit VecLanes(int width)
      : lanes(width <= 64    ? 8
              : width <= 128 ? 16
                             : 32),
        rows_per_pass(32 / lanes) {}
  /// This lane's row within pass `pass` (0 .. kAuxRowsPerWarp / rows_per_pass - 1) and chunk start.
  FP_DEV int row_k(int pass) const { return pass * rows_per_pass + lane_id() / lanes; }
  FP_DEV int chunk0() const { return (lane_id() % lanes) * 8; }
  FP_DEV int passes() const { return kAuxRowsPerWarp / rows_per_pass; }
  /// Sum over the lanes sharing this lane's row (every lane of the warp must call it).
  FP_DEV float group_sum(float v) const {
    for (int m = lanes / 2; m > 0; m >>= 1) v += shfl_xor(v, m);
    return v;
  }
};

/// Zeroes this CTA's share of prm.zero_words 16-byte words from prm.dq_accum: the CTAs of the whole
/// (ceil(sq / kBwdAuxRows), hq, batch) grid, over every batch chunk, in order, each a contiguous run.
/// Layout-blind, so every accumulator layout and the tile counters after it are covered alike.
FP_DEV void zero_accumulator_share(const BwdParams& prm) {
  const i64 ctas = (i64)gridDim.x * gridDim.y * prm.p.batch;
  const i64 cta = ((block_z() + prm.batch_offset) * gridDim.y + block_y()) * gridDim.x + block_x();
  const i64 share = ceil_div(prm.zero_words, ctas);
  const i64 end = cta * share + share < prm.zero_words ? cta * share + share : prm.zero_words;
  U32x4* words = reinterpret_cast<U32x4*>(prm.dq_accum);
  for (i64 w = cta * share + threadIdx.x; w < end; w += blockDim.x)
    st_global_16(words + w, U32x4{0, 0, 0, 0});
}

/// Sum of the products of the 8 elements in a and b (16 bytes each).
template <class E>
FP_DEV float dot8(const U32x4& a, const U32x4& b) {
  const u32 ra[4] = {a.x, a.y, a.z, a.w}, rb[4] = {b.x, b.y, b.z, b.w};
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const Float2 fa = E::unpack(ra[k]), fb = E::unpack(rb[k]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

/// D_i = sum_c dO[i, c] * O[i, c] in fp32 into prm.dsum (LSE layout). Grid (ceil(p.sq / 16), hq,
/// batch), 128 threads; one warp per row, lanes over 8-channel chunks; rows past the sequence skipped
/// (the main kernel never reads them). A template so the 16-byte path is dropped for fp32.
template <class E>
FP_DEV void dot_do_o(const BwdParams& prm) {
  using S = typename E::Storage;
  const AttnProblem& p = prm.p;
  const int b = (int)blockIdx.z + prm.batch_offset, h = (int)blockIdx.y, lane = lane_id();
  const Seq seq = sequence(p, b);
  const bool varlen = p.cu_seqlens_q != nullptr;
  const i64 d_row0 = lse_row0(p, seq, b, h);
  auto row_ptr = [&](const Operand& t, int i) {
    return static_cast<const S*>(t.ptr) + row_offset(t, varlen, b, seq.q_start, i, h);
  };
  if constexpr (sizeof(S) == 2) {
    if (prm.vec) {
      const VecLanes vl(p.dv);
      for (int pass = 0; pass < vl.passes(); ++pass) {
        const int i = aux_row(vl.row_k(pass));
        float acc = 0.0f;
        if (i < seq.len_q) {  // no early exit: the group sum below needs every lane
          const S *o = row_ptr(p.o, i), *dout = row_ptr(p.dout, i);
          for (int c = vl.chunk0(); c < p.dv; c += vl.lanes * 8)
            acc += dot8<E>(ld_global_16(o + c), ld_global_16(dout + c));
        }
        acc = vl.group_sum(acc);
        if (i < seq.len_q && vl.chunk0() == 0) prm.dsum[d_row0 + i] = acc;
      }
      return;
    }
  }
  for (int k = 0; k < kAuxRowsPerWarp; ++k) {
    const int i = aux_row(k);
    if (i >= seq.len_q) break;
    const S *o = row_ptr(p.o, i), *dout = row_ptr(p.dout, i);
    float acc = 0.0f;
    for (int c = lane; c < p.dv; c += 32) acc = fmaf(E::to_float(o[c]), E::to_float(dout[c]), acc);
    acc = warp_sum(acc);
    if (lane == 0) prm.dsum[d_row0 + i] = acc;
  }
}

/// dq[i, c] = scale * sum over slices s = 0, 1, ... (in that order) of dq_accum[s][h][row(i)][c], in the
/// input dtype (tiled: element (i, c) at tile i / 64, accum_tile_offset(i % 64, c, accum_tiled)). Grid and
/// rows as attn_bwd_dot_do_o; every row of the sequence and channel < d written.
template <class E>
FP_DEV void dq_convert(const BwdParams& prm) {
  using S = typename E::Storage;
  constexpr bool kVec16 = sizeof(S) == 2;
  const AttnProblem& p = prm.p;
  const int b = (int)blockIdx.z + prm.batch_offset, h = (int)blockIdx.y, lane = lane_id();
  const Seq seq = sequence(p, b);
  const bool varlen = p.cu_seqlens_q != nullptr;
  const i64 slice_stride = p.hq * prm.rows_total * prm.accum_ld;
  const bool tiled = prm.accum_tiled != 0;
  const float* head_accum =
      prm.dq_accum + ((i64)h * prm.rows_total + accum_row0(p, seq, b, tiled)) * prm.accum_ld;
  const VecLanes vl(p.d);
  // 16-byte path: pass over rows as VecLanes splits them (no shuffles, so lanes past the end just stop);
  // the scalar path: one warp per row, kAuxRowsPerWarp rows.
  const int vec = kVec16 ? prm.vec : 0;
  const int passes = vec ? vl.passes() : kAuxRowsPerWarp;
  for (int pass = 0; pass < passes; ++pass) {
    const int i = aux_row(vec ? vl.row_k(pass) : pass);
    if (i >= seq.len_q) break;
    // Row i's columns c.. at acc + at(c) (16-byte aligned for c % 8 == 0: accum_ld % 32 == 0).
    const float* acc = head_accum + (i64)(tiled ? i & ~63 : i) * prm.accum_ld;
    auto at = [&](int c) { return tiled ? accum_tile_offset(i & 63, c, prm.accum_tiled) : c; };
    S* dq = static_cast<S*>(p.grad_q.ptr) + row_offset(p.grad_q, varlen, b, seq.q_start, i, h);
    if (vec) {
      if constexpr (kVec16) {
        for (int c = vl.chunk0(); c < p.d; c += vl.lanes * 8) {
          float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int sl = 0; sl < prm.num_slices; ++sl) {
            const U32x4 lo = ld_global_16(acc + sl * slice_stride + at(c)),
                        hi = ld_global_16(acc + sl * slice_stride + at(c) + 4);
            s[0] += u32_as_float(lo.x), s[1] += u32_as_float(lo.y), s[2] += u32_as_float(lo.z);
            s[3] += u32_as_float(lo.w), s[4] += u32_as_float(hi.x), s[5] += u32_as_float(hi.y);
            s[6] += u32_as_float(hi.z), s[7] += u32_as_float(hi.w);
          }
          const float sc = p.scale;
          st_global_16(dq + c, U32x4{E::pack(s[0] * sc, s[1] * sc), E::pack(s[2] * sc, s[3] * sc),
                                     E::pack(s[4] * sc, s[5] * sc), E::pack(s[6] * sc, s[7] * sc)});
        }
      }
    } else {
      for (int c = lane; c < p.d; c += 32) {
        float s = 0.0f;
        for (int sl = 0; sl < prm.num_slices; ++sl) s += acc[sl * slice_stride + at(c)];
        dq[c] = E::from_float(s * p.scale);
      }
    }
  }
}

}  // namespace flashport::cuda::bwd

using namespace flashport;
using namespace flashport::cuda;
using namespace flashport::cuda::bwd;

extern "C" __global__ void __launch_bounds__(kBwdAuxThreads)
    attn_bwd_dot_do_o(const __grid_constant__ BwdParams prm) {
  order_after_prior_grids();
  // The stores first: they need no load, so they leave while the row loads below wait.
  zero_accumulator_share(prm);
  dot_do_o<Elem>(prm);
}

extern "C" __global__ void __launch_bounds__(kBwdAuxThreads)
    attn_bwd_dq_convert(const __grid_constant__ BwdParams prm) {
  order_after_prior_grids();
  dq_convert<Elem>(prm);
}
