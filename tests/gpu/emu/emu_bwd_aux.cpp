// The emulated D and dQ-convert kernels of the backward. build.sh compiles this file once per dtype: f32
// (the fp32 backward's steps around its emulated main kernel) and bf16 (their 16-byte path, which
// test_bwd_aux.cpp launches on its own: the 16-bit main kernels are not emulated), the second with its
// entry points renamed (-Dattn_bwd_dot_do_o=...) so the objects link together.
#ifndef FP_DTYPE
#define FP_DTYPE f32
#endif
#include "cuda/attn_bwd_aux.cu"
#include "emu_kernels.hpp"

namespace {
void dot_trampoline(void* const* args) {
  attn_bwd_dot_do_o(*static_cast<const flashport::cuda::BwdParams*>(args[0]));
}
void convert_trampoline(void* const* args) {
  attn_bwd_dq_convert(*static_cast<const flashport::cuda::BwdParams*>(args[0]));
}
const flashport::emu::Registrar dot_reg("attn_bwd_dot_do_o|FP_DTYPE=" FP_EMU_STR(FP_DTYPE), dot_trampoline);
const flashport::emu::Registrar convert_reg("attn_bwd_dq_convert|FP_DTYPE=" FP_EMU_STR(FP_DTYPE),
                                            convert_trampoline);
}  // namespace
