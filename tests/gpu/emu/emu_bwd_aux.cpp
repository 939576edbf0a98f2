// The emulated D and dQ-convert kernels of the backward, fp32 (the fp32 backward's steps around its main
// kernel; the 16-bit backward's main kernels are not emulated).
#define FP_DTYPE f32
#include "cuda/attn_bwd_aux.cu"
#include "emu_kernels.hpp"

namespace {
void dot_trampoline(const void* p) {
  attn_bwd_dot_do_o(*static_cast<const flashport::cuda::BwdParams*>(p));
}
void convert_trampoline(const void* p) {
  attn_bwd_dq_convert(*static_cast<const flashport::cuda::BwdParams*>(p));
}
const flashport::emu::Registrar dot_reg("attn_bwd_dot_do_o|FP_DTYPE=f32", dot_trampoline);
const flashport::emu::Registrar convert_reg("attn_bwd_dq_convert|FP_DTYPE=f32", convert_trampoline);
}  // namespace
