// Warp-level building blocks of the backward kernel: operand fragments from shared memory in both
// storage orders, a warp tile GEMM, the warp grid chooser, and the fp32 global accumulation of dQ
// (Philox keep bits for one mma tile: cuda/common/dropout.cuh).
#pragma once

#include "core/problem.h"
#include "cuda/common/common.cuh"
#include "cuda/common/dropout.cuh"

namespace flashport::cuda::bwd {

// ---------------------------------------------------------------------------------------------
// Fragments (layouts: cuda/common/mma.cuh). Shared tiles are row-major 16-bit with a compile-time
// pitch (elements). Every 8x8 matrix read by ldmatrix is 8 rows of 16 contiguous bytes, so row starts
// (pitch * 2 bytes, column offsets multiples of 8) are 16-byte aligned. A lane's ldmatrix address is
// split into a per-lane base (computed once per stage) plus a compile-time offset per fragment, so
// the unrolled loops do not keep one address register per fragment alive.
//
// Which 8x8 matrix lane L addresses (q = L / 8) and where its row starts, per operand kind:
//   A, m as rows (e.g. Q for S = Q K^T):       q = 0 (m+0, k+0), 1 (m+8, k+0), 2 (m+0, k+8), 3 (m+8, k+8)
//     = a0..a3 directly.
//   A, k as rows (A = X^T, e.g. P^T from s_p):  .trans gives lane (g, t) X[k+2t..2t+1][m+g] = A[g][2t..];
//     matrix q at stored (k, m) = 0 (k+0, m+0) -> a0, 1 (k+0, m+8) -> a1, 2 (k+8, m+0) -> a2, 3 (k+8, m+8).
//   B, n as rows (e.g. K for S = Q K^T):       q = 0 (n+0, k+0), 1 (n+0, k+8), 2 (n+8, k+0), 3 (n+8, k+8):
//     b[0..1] = n8 tile n0, b[2..3] = n8 tile n0 + 8.
//   B, k as rows (e.g. dO for dV = P^T dO):    .trans gives lane (g, t) X[k+2t..2t+1][n+g] = b0;
//     matrix q at stored (k, n) = 0 (k+0, n+0), 1 (k+8, n+0), 2 (k+0, n+8), 3 (k+8, n+8).

/// Operand storage orders. kRowsM / kRowsN: the tile's rows run along the output's m / n index;
/// kRowsK: the tile's rows run along the reduction index k (read with ldmatrix .trans).
enum class Store { kRowsM, kRowsN, kRowsK };

/// Byte offset of lane `lane`'s ldmatrix row for the fragment at (mn0, k0) = (0, 0), relative to the
/// tile: add frag_offset for other fragments. `is_a`: A operand (else B).
template <Store kStore, bool kIsA, int kPitch>
FP_DEV u32 lane_offset(int mn0, int lane) {
  const int l8 = lane & 7, q1 = (lane >> 3) & 1, q2 = lane >> 4;
  int row, col;
  if constexpr (kStore == Store::kRowsK) {
    // A: matrices step m by 8 with q1, k by 8 with q2. B: k by 8 with q1, n by 8 with q2.
    row = l8 + (kIsA ? q2 : q1) * 8;
    col = mn0 + (kIsA ? q1 : q2) * 8;
  } else {
    // A (m rows): m by 8 with q1, k by 8 with q2. B (n rows): n by 8 with q2, k by 8 with q1.
    row = mn0 + l8 + (kIsA ? q1 : q2) * 8;
    col = (kIsA ? q2 : q1) * 8;
  }
  return (u32)(row * kPitch + col) * 2u;
}

/// Compile-time byte offset of the fragment whose m (A) or n (B) index starts at mn and k at k.
template <Store kStore, int kPitch>
FP_DEV constexpr u32 frag_offset(int mn, int k) {
  return kStore == Store::kRowsK ? (u32)(k * kPitch + mn) * 2u : (u32)(mn * kPitch + k) * 2u;
}

/// acc (kMT m16 tiles x kNT n8 tiles: this warp's output tile) += A B over k in [0, kK); k-steps at
/// or beyond `k_end` are skipped (their operands are zero-filled). `a_lane` / `b_lane`: shared
/// address of the tile plus lane_offset for this warp's m0 / n0.
/// kUnroll: k-steps unrolled (fewer keep fewer prefetched fragments alive).
template <class Elem, int kMT, int kNT, int kK, Store kAStore, int kAPitch, Store kBStore, int kBPitch,
          int kUnroll = kK / 16>
FP_DEV void warp_mma(float (&acc)[kMT][kNT][4], u32 a_lane, u32 b_lane, int k_end) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0, "warp tiles are whole m16 x n16 x k16 steps");
  static_assert(kAStore != Store::kRowsN && kBStore != Store::kRowsM, "operand order");
#pragma unroll kUnroll
  for (int k0 = 0; k0 < kK; k0 += 16) {
    if (k0 >= k_end) break;
    u32 a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      const u32 at = a_lane + frag_offset<kAStore, kAPitch>(16 * mt, k0);
      if constexpr (kAStore == Store::kRowsK)
        ldmatrix_x4_trans(a[mt], at);
      else
        ldmatrix_x4(a[mt], at);
    }
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      u32 b[4];
      const u32 at = b_lane + frag_offset<kBStore, kBPitch>(16 * np, k0);
      if constexpr (kBStore == Store::kRowsK)
        ldmatrix_x4_trans(b, at);
      else
        ldmatrix_x4(b, at);
      const u32 b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        mma<Elem>(acc[mt][2 * np], a[mt], b_lo);
        mma<Elem>(acc[mt][2 * np + 1], a[mt], b_hi);
      }
    }
  }
}

/// One k-step's fragments of this lane: A of kMT m16 tiles, B of kNT / 2 n16 pairs (b[np][0..1]: n8
/// tile 2 np, b[np][2..3]: n8 tile 2 np + 1), at reduction index k0.
template <int kMT, int kNT, Store kAStore, int kAPitch, Store kBStore, int kBPitch>
FP_DEV void load_frags(u32 (&a)[kMT][4], u32 (&b)[kNT / 2][4], u32 a_lane, u32 b_lane, int k0) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const u32 at = a_lane + frag_offset<kAStore, kAPitch>(16 * mt, k0);
    if constexpr (kAStore == Store::kRowsK)
      ldmatrix_x4_trans(a[mt], at);
    else
      ldmatrix_x4(a[mt], at);
  }
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    const u32 at = b_lane + frag_offset<kBStore, kBPitch>(16 * np, k0);
    if constexpr (kBStore == Store::kRowsK)
      ldmatrix_x4_trans(b[np], at);
    else
      ldmatrix_x4(b[np], at);
  }
}

/// acc += the k-step held in a, b (load_frags).
template <class Elem, int kMT, int kNT>
FP_DEV void mma_frags(float (&acc)[kMT][kNT][4], const u32 (&a)[kMT][4], const u32 (&b)[kNT / 2][4]) {
#pragma unroll
  for (int np = 0; np < kNT / 2; ++np) {
    const u32 b_lo[2] = {b[np][0], b[np][1]}, b_hi[2] = {b[np][2], b[np][3]};
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      mma<Elem>(acc[mt][2 * np], a[mt], b_lo);
      mma<Elem>(acc[mt][2 * np + 1], a[mt], b_hi);
    }
  }
}

/// warp_mma with the fragments of k-step s + 1 loaded before the mma of step s (two register
/// buffers): the ldmatrix latency hides behind the previous step's mma instead of stalling every
/// step (with 8 warps per SM nothing else covers it). The look-ahead load past k_end reads zeros or
/// stale values inside the tile and is never used.
template <class Elem, int kMT, int kNT, int kK, Store kAStore, int kAPitch, Store kBStore, int kBPitch>
FP_DEV void warp_mma_pipe(float (&acc)[kMT][kNT][4], u32 a_lane, u32 b_lane, int k_end) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0, "warp tiles are whole m16 x n16 x k16 steps");
  constexpr int kSteps = kK / 16;
  // Two named buffers and steps in pairs: every index is static even where the loop stays rolled
  // (an array indexed by s % 2 went to local memory at d160).
  u32 a_even[kMT][4], b_even[kNT / 2][4], a_odd[kMT][4], b_odd[kNT / 2][4];
  load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a_even, b_even, a_lane, b_lane, 0);
#pragma unroll
  for (int s = 0; s < kSteps; s += 2) {
    if (16 * s >= k_end) break;
    if (s + 1 < kSteps)
      load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a_odd, b_odd, a_lane, b_lane, 16 * (s + 1));
    mma_frags<Elem>(acc, a_even, b_even);
    if (s + 1 >= kSteps || 16 * (s + 1) >= k_end) break;
    if (s + 2 < kSteps)
      load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a_even, b_even, a_lane, b_lane, 16 * (s + 2));
    mma_frags<Elem>(acc, a_odd, b_odd);
  }
}

/// Two products of the same shape over the same k range in one pipelined loop (S = Q K^T with
/// dP = dO V^T): twice the independent mma per k-step to cover the mma latency. Operands are
/// zero-filled past their own width, so one k_end (the larger) serves both.
template <class Elem, int kMT, int kNT, int kK, Store kAStore, int kAPitch, Store kBStore, int kBPitch>
FP_DEV void warp_mma_dual(float (&acc0)[kMT][kNT][4], u32 a0_lane, u32 b0_lane, float (&acc1)[kMT][kNT][4],
                          u32 a1_lane, u32 b1_lane, int k_end) {
  static_assert(kNT % 2 == 0 && kK % 16 == 0, "warp tiles are whole m16 x n16 x k16 steps");
  constexpr int kSteps = kK / 16;
  u32 a0_even[kMT][4], b0_even[kNT / 2][4], a0_odd[kMT][4], b0_odd[kNT / 2][4];  // as warp_mma_pipe
  u32 a1_even[kMT][4], b1_even[kNT / 2][4], a1_odd[kMT][4], b1_odd[kNT / 2][4];
  load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a0_even, b0_even, a0_lane, b0_lane, 0);
  load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a1_even, b1_even, a1_lane, b1_lane, 0);
#pragma unroll
  for (int s = 0; s < kSteps; s += 2) {
    if (16 * s >= k_end) break;
    if (s + 1 < kSteps) {
      load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a0_odd, b0_odd, a0_lane, b0_lane,
                                                               16 * (s + 1));
      load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a1_odd, b1_odd, a1_lane, b1_lane,
                                                               16 * (s + 1));
    }
    mma_frags<Elem>(acc0, a0_even, b0_even);
    mma_frags<Elem>(acc1, a1_even, b1_even);
    if (s + 1 >= kSteps || 16 * (s + 1) >= k_end) break;
    if (s + 2 < kSteps) {
      load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a0_even, b0_even, a0_lane, b0_lane,
                                                               16 * (s + 2));
      load_frags<kMT, kNT, kAStore, kAPitch, kBStore, kBPitch>(a1_even, b1_even, a1_lane, b1_lane,
                                                               16 * (s + 2));
    }
    mma_frags<Elem>(acc0, a0_odd, b0_odd);
    mma_frags<Elem>(acc1, a1_odd, b1_odd);
  }
}

template <int kMT, int kNT>
FP_DEV void zero(float (&acc)[kMT][kNT][4]) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
}

// ---------------------------------------------------------------------------------------------
// Warp grids.

/// `rows` x `cols` warps tiling an (m, n) output: warp w owns rows [(w / cols) * m / rows, ...) and
/// columns [(w % cols) * n / cols, ...).
struct WarpGrid {
  int rows, cols;
};

/// The split of `warps` warps over an (m, n) tile whose warp tiles are whole m16 x n16 steps and have
/// the smallest perimeter (fewest fragment loads per mma). {0, 0} when none exists.
FP_HD constexpr WarpGrid warp_grid(int m, int n, int warps) {
  WarpGrid best{0, 0};
  int best_cost = 1 << 30;
  for (int r = 1; r <= warps; ++r) {
    if (warps % r != 0) continue;
    const int c = warps / r;
    if (m % (16 * r) != 0 || n % (16 * c) != 0) continue;
    const int cost = m / r + n / c;
    if (cost < best_cost) best_cost = cost, best = WarpGrid{r, c};
  }
  return best;
}

/// The split with the most warps along m (16-row warp tiles where possible): for outputs done in
/// column chunks, where a short warp tile makes each chunk's accumulators few.
FP_HD constexpr WarpGrid warp_grid_tall(int m, int n, int warps) {
  for (int r = warps; r >= 1; --r) {
    if (warps % r != 0) continue;
    const int c = warps / r;
    if (m % (16 * r) == 0 && n % (16 * c) == 0) return WarpGrid{r, c};
  }
  return WarpGrid{0, 0};
}

// ---------------------------------------------------------------------------------------------
// Memory helpers.

FP_DEV void st_shared_u32(u32 s_addr, u32 v) {
#ifdef __CUDA_ARCH__
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(s_addr), "r"(v) : "memory");
#else  // host build of the kernel emulator (tests/gpu/emu): shared addresses are byte offsets
  __builtin_memcpy(emu::dynamic_shared() + s_addr, &v, 4);
#endif
}

/// Adds (x, y) to g[0], g[1] (8-byte aligned) in global memory, fire-and-forget atomics.
FP_DEV void red_add_f32x2(float* g, float x, float y) {
#ifndef __CUDA_ARCH__  // kernel emulator: blocks run one at a time
  g[0] += x;
  g[1] += y;
#elif __CUDA_ARCH__ >= 900
  asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};" ::"l"(g), "f"(x), "f"(y) : "memory");
#else
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(g), "f"(x) : "memory");
  asm volatile("red.relaxed.gpu.global.add.f32 [%0], %1;" ::"l"(g + 1), "f"(y) : "memory");
#endif
}

}  // namespace flashport::cuda::bwd
