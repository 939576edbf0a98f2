// Where each matrix element of the MFMA instructions the kernels use lives: (lane, element) <->
// (row, column), as AMD documents it. The CPU wave64 model (model.hpp) computes its MFMA through these
// maps, and the kernels' fragment comments cite them.
//
// Source: AMD Matrix Instruction Calculator (github.com/ROCm/amd_matrix_instruction_calculator,
// matrix_calculator.py: the gfx9 input-register rule "lane = (k / elements_per_gpr) * M * B + i,
// element k % elements_per_gpr" and the 32-bit output rule "rows in 4-register multirows of N lanes").
// For v_mfma_f32_16x16x16bf16_1k (CDNA2 gfx90a; spelled v_mfma_f32_16x16x16_bf16 on CDNA3 gfx94x) and
// v_mfma_f32_16x16x16f16 (both) M = N = K = 16, one block, wave64, so:
//   A (16 x 16, M x K), 4 x 16-bit per lane:  A[l % 16][4 (l / 16) + e]      (lane l, element e)
//   B (16 x 16, K x N), 4 x 16-bit per lane:  B[4 (l / 16) + e][l % 16]
//   C, D (16 x 16, M x N), 4 x fp32 per lane: D[4 (l / 16) + r][l % 16]      (lane l, register r)
// The layout is the same on CDNA2 and CDNA3 for these instructions (the calculator's tables for
// --architecture cdna2 and cdna3 agree); CBSZ/ABID/BLGP stay 0.
#pragma once

#include "core/semantics.h"

namespace flashport::wave::layout16 {

inline constexpr int kM = 16, kN = 16, kK = 16;
inline constexpr int kElems = 4;  // elements (A, B) or registers (C/D) per lane

/// A matrix position.
struct Coord {
  int row, col;
};

/// A (M x K): element e of lane l.
FP_HD Coord a_elem(int lane, int e) {
  return {lane & 15, 4 * (lane >> 4) + e};
}
/// B (K x N): element e of lane l.
FP_HD Coord b_elem(int lane, int e) {
  return {4 * (lane >> 4) + e, lane & 15};
}
/// C/D (M x N): register r of lane l.
FP_HD Coord cd_elem(int lane, int r) {
  return {4 * (lane >> 4) + r, lane & 15};
}
/// The inverse maps: the lane holding A[i][k] / B[k][j] (element k % 4) and D[i][j] (register i % 4).
FP_HD int a_lane(int i, int k) {
  return 16 * (k >> 2) + i;
}
FP_HD int b_lane(int k, int j) {
  return 16 * (k >> 2) + j;
}
FP_HD int cd_lane(int i, int j) {
  return 16 * (i >> 2) + j;
}

}  // namespace flashport::wave::layout16
