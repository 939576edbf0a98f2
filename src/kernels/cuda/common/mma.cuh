// Tensor-core building blocks for sm_80+: mma.sync m16n8k16 (fp32 accumulate) and ldmatrix.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with g = lane / 4, t = lane % 4:
//   A (16x16, row major), 4 regs of 2 elements: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
//     a3 = (g+8, 2t+8..).
//   B (16x8, k x n, "col"), 2 regs: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g).
//   C/D (16x8), 4 floats: c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1).
// ldmatrix m8n8 (b16): lanes 8i..8i+7 give the 8 row addresses (16 contiguous bytes each) of matrix i;
//   thread `lane` receives, of matrix i, row lane/4, columns 2(lane%4)..+1 in register i (the
//   transposed element pair with .trans: rows 2(lane%4)..+1 of column lane/4).
#pragma once

#include "cuda/common/types.cuh"

namespace flashport::cuda {

/// c += a * b for one m16n8k16 tile, fp16 inputs, fp32 accumulators.
FP_DEV void mma_m16n8k16(f16, float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// c += a * b for one m16n8k16 tile, bf16 inputs, fp32 accumulators.
FP_DEV void mma_m16n8k16(bf16, float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/// Typed front end: mma<Elem>(c, a, b).
template <class Elem>
FP_DEV void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  mma_m16n8k16(Elem{}, c, a, b);
}

/// Four 8x8 b16 matrices from shared memory; `smem_row` is this lane's row address (see header).
FP_DEV void ldmatrix_x4(u32 (&r)[4], u32 smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row));
}

/// Four 8x8 b16 matrices, each transposed on the way (B operands stored k-major, e.g. V).
FP_DEV void ldmatrix_x4_trans(u32 (&r)[4], u32 smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row));
}

/// Two 8x8 b16 matrices (lanes 0-15 give the row addresses; the others are ignored but must be valid).
FP_DEV void ldmatrix_x2(u32 (&r)[2], u32 smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_row));
}

/// Two 8x8 b16 matrices, transposed.
FP_DEV void ldmatrix_x2_trans(u32 (&r)[2], u32 smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_row));
}

}  // namespace flashport::cuda
