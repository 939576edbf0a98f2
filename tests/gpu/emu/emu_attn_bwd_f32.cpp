// One emulated fp32 backward main-kernel variant; build.sh compiles this file once per head-dim bucket
// with -D FP_HEADDIM plus -Dbwd32=... -Dattn_bwd_f32=... renames so the variants link together.
#include "cuda/attn_bwd_f32.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(void* const* args) {
  attn_bwd_f32(*static_cast<const flashport::cuda::BwdParams*>(args[0]));
}
const flashport::emu::Registrar reg("attn_bwd_f32|FP_HEADDIM=" FP_EMU_STR(FP_HEADDIM), trampoline);
}  // namespace
