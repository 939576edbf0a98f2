// Emulator stand-in for cuda/common/mma.cuh: mma.sync and ldmatrix as warp collectives that
// follow the PTX ISA fragment layouts (implemented in emu_runtime.cpp, independent of the kernels).
#pragma once

#include "cuda/common/types.cuh"

namespace flashport::emu {
/// mma.m16n8k16 row.col, fp32 accumulate; `bf16` selects the input type.
void mma_16816(bool bf16, float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]);
/// ldmatrix .m8n8 .b16 with `count` matrices (1, 2, 4), optionally .trans.
void ldmatrix(unsigned* r, int count, bool trans, unsigned smem_row);
}  // namespace flashport::emu

namespace flashport::cuda {

inline void mma_m16n8k16(f16, float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  emu::mma_16816(false, c, a, b);
}
inline void mma_m16n8k16(bf16, float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  emu::mma_16816(true, c, a, b);
}
template <class Elem>
inline void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  mma_m16n8k16(Elem{}, c, a, b);
}
inline void ldmatrix_x4(u32 (&r)[4], u32 s) {
  emu::ldmatrix(r, 4, false, s);
}
inline void ldmatrix_x4_trans(u32 (&r)[4], u32 s) {
  emu::ldmatrix(r, 4, true, s);
}
inline void ldmatrix_x2(u32 (&r)[2], u32 s) {
  emu::ldmatrix(r, 2, false, s);
}
inline void ldmatrix_x2_trans(u32 (&r)[2], u32 s) {
  emu::ldmatrix(r, 2, true, s);
}

}  // namespace flashport::cuda
