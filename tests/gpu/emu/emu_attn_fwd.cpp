// One emulated forward variant; build.sh compiles this file once per (dtype, head-dim bucket) with
// -D FP_DTYPE ... FP_STAGES plus -Dfwd=... -Dattn_fwd=... renames so the variants link together.
#include "cuda/attn_fwd.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(const void* p) {
  attn_fwd(*static_cast<const flashport::cuda::FwdParams*>(p));
}
const flashport::emu::Registrar reg(
    "attn_fwd|FP_DTYPE=" FP_EMU_STR(FP_DTYPE) ",FP_HEADDIM=" FP_EMU_STR(FP_HEADDIM) ",FP_BLOCK_N=" FP_EMU_STR(
        FP_BLOCK_N) ",FP_WARPS=" FP_EMU_STR(FP_WARPS) ",FP_STAGES=" FP_EMU_STR(FP_STAGES),
    trampoline);
}  // namespace
