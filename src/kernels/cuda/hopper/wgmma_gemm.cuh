// GEMMs of several wgmma k steps over the Wgmma<N> / WgmmaFp8<N> instructions wgmma.cuh defines (the
// CUDA emulator's stand-in for wgmma.cuh includes this file too).
#pragma once

#include "cuda/hopper/sm90.cuh"

namespace flashport::cuda::sm90 {

/// D (64 x N) = A B^T in kSteps wgmmas of `Mma` (Wgmma<N> or WgmmaFp8<N>), both operands K-major
/// 128B-swizzled tiles stored as 128-byte chunks (sm90.cuh): k step kk is 32 bytes into its chunk (16
/// two-byte or 32 one-byte elements), chunks kAChunk / kBChunk bytes apart. The first wgmma overwrites D.
template <class Mma, int kSteps, u32 kAChunk, u32 kBChunk, int N>
FP_DEV void gemm_ss_kmajor_steps(float (&d)[N / 2], u64 desc_a, u64 desc_b) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk) {
    const u32 a_off = (kk / 4) * kAChunk + (kk % 4) * 32, b_off = (kk / 4) * kBChunk + (kk % 4) * 32;
    Mma::ss(d, desc_advance(desc_a, a_off), desc_advance(desc_b, b_off), kk == 0 ? 0u : 1u);
  }
}

/// D (64 x N) = A B^T over K = kK 16-bit elements (gemm_ss_kmajor_steps).
template <int N, int kK, u32 kAChunk, u32 kBChunk>
FP_DEV void gemm_ss_kmajor(float (&d)[N / 2], u64 desc_a, u64 desc_b) {
  gemm_ss_kmajor_steps<Wgmma<N>, kK / 16, kAChunk, kBChunk, N>(d, desc_a, desc_b);
}

/// The same over K = kK e4m3 elements (the FP8 forward's S = Q K^T).
template <int N, int kK, u32 kAChunk, u32 kBChunk>
FP_DEV void gemm_ss_kmajor_fp8(float (&d)[N / 2], u64 desc_a, u64 desc_b) {
  gemm_ss_kmajor_steps<WgmmaFp8<N>, kK / 32, kAChunk, kBChunk, N>(d, desc_a, desc_b);
}

/// D (64 x N) += A B over K = kK one-byte elements: A in registers (four e4m3 per register, four
/// registers per 32-element k step in the m16n8k32 A layout: (g, 4t..4t+3), (g + 8, ..), (g, 16 + 4t..),
/// (g + 8, ..)), B K-major in chunks of 128 elements kBChunk bytes apart.
template <int N, int kK, u32 kBChunk>
FP_DEV void gemm_rs_kmajor_fp8(float (&d)[N / 2], const u32 (&a)[kK / 8], u64 desc_b) {
#pragma unroll
  for (int kk = 0; kk < kK / 32; ++kk)
    WgmmaFp8<N>::rs(d, a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3],
                    desc_advance(desc_b, (kk / 4) * kBChunk + (kk % 4) * 32), 1u);
}

/// D (64 x N) += A B over K = kK: A in registers (accumulator pairs packed as in the header comment),
/// B MN-major, k step of 16 rows = 16 x 128 bytes.
template <int N, int kK>
FP_DEV void gemm_rs_mn(float (&d)[N / 2], const u32 (&a)[kK / 4], u64 desc_b) {
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    Wgmma<N>::rs(d, a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3],
                 desc_advance(desc_b, kk * 16 * 128), 1u);
}

/// D (64 x N) += A B over K = kK <= 64: A K-major in one 128B-swizzled chunk (k step 32 bytes), B MN-major
/// (k step of 16 rows = 16 x 128 bytes).
template <int N, int kK>
FP_DEV void gemm_ss_kmn(float (&d)[N / 2], u64 desc_a, u64 desc_b) {
  static_assert(kK <= 64, "A's K must fit one 64-element chunk");
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    Wgmma<N>::ss_kmn(d, desc_advance(desc_a, kk * 32), desc_advance(desc_b, kk * 16 * 128), 1u);
}

}  // namespace flashport::cuda::sm90
