// Emulator stand-in for cuda/hopper/wgmma.cuh: Wgmma<N> / WgmmaFp8<N> over emu_sm90.cpp's wgmma, which
// reads the shared-memory operands through their descriptors (swizzle included) and runs when issued;
// the multi-step GEMMs are the real ones (wgmma_gemm.cuh).
#pragma once

#include "cuda/common/types.cuh"
#include "emu_sm90.hpp"

#ifndef FP_DTYPE
#error "wgmma.cuh needs -D FP_DTYPE=bf16|f16"
#endif

namespace flashport::cuda::sm90 {

template <emu::MmaType kType, int N>
struct EmuWgmma {
  static void ss(float (&d)[N / 2], u64 desc_a, u64 desc_b, u32 scale_d) {
    emu::wgmma(kType, N, d, desc_a, false, nullptr, desc_b, false, scale_d);
  }
  static void ss_mn(float (&d)[N / 2], u64 desc_a, u64 desc_b, u32 scale_d) {
    emu::wgmma(kType, N, d, desc_a, true, nullptr, desc_b, true, scale_d);
  }
  static void ss_kmn(float (&d)[N / 2], u64 desc_a, u64 desc_b, u32 scale_d) {
    emu::wgmma(kType, N, d, desc_a, false, nullptr, desc_b, true, scale_d);
  }
  /// B MN-major for 16-bit types, K-major for e4m3 (wgmma.cuh's rs).
  static void rs(float (&d)[N / 2], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc_b, u32 scale_d) {
    const unsigned a[4] = {a0, a1, a2, a3};
    emu::wgmma(kType, N, d, 0, false, a, desc_b, kType != emu::MmaType::kE4M3, scale_d);
  }
};

template <int N>
struct Wgmma : EmuWgmma<FP_DTYPE::kElemType == 3 ? emu::MmaType::kBF16 : emu::MmaType::kF16, N> {};
template <int N>
struct WgmmaFp8 : EmuWgmma<emu::MmaType::kE4M3, N> {};

}  // namespace flashport::cuda::sm90

#include "cuda/hopper/wgmma_gemm.cuh"
