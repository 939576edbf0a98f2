// One emulated forward variant; build.sh compiles this file once per (dtype, head-dim bucket) with
// -D FP_DTYPE ... FP_STAGES (and FP_FP8=1 for the fp8 variants, FP_DECODE=1 for the decode ones) plus
// -Dfwd=... -Dattn_fwd=... renames so the variants link together.
#include "cuda/attn_fwd.cu"
#include "emu_kernels.hpp"

// The registry key is kernel_name(spec): the fp8 variants' spec has FP_FP8=1, the decode variants'
// FP_DECODE=1 after it, the decode shapes of several CTAs per SM FP_MIN_BLOCKS=n after that, then the bulk
// row copies FP_BULK=1, and the cluster merge FP_CLUSTER=1 last.
#if FP_FP8
#define FP_EMU_FP8_SUFFIX ",FP_FP8=1"
#else
#define FP_EMU_FP8_SUFFIX ""
#endif
#if FP_DECODE
#define FP_EMU_DECODE_SUFFIX ",FP_DECODE=1"
#else
#define FP_EMU_DECODE_SUFFIX ""
#endif
#if FP_MIN_BLOCKS > 1
#define FP_EMU_MIN_BLOCKS_SUFFIX ",FP_MIN_BLOCKS=" FP_EMU_STR(FP_MIN_BLOCKS)
#else
#define FP_EMU_MIN_BLOCKS_SUFFIX ""
#endif

#if FP_BULK
#define FP_EMU_BULK_SUFFIX ",FP_BULK=1"
#else
#define FP_EMU_BULK_SUFFIX ""
#endif
#if FP_CLUSTER
#define FP_EMU_CLUSTER_SUFFIX ",FP_CLUSTER=1"
#else
#define FP_EMU_CLUSTER_SUFFIX ""
#endif

namespace {
void trampoline(void* const* args) {
  attn_fwd(*static_cast<const flashport::cuda::FwdParams*>(args[0]));
}
const flashport::emu::Registrar reg(
    "attn_fwd|FP_DTYPE=" FP_EMU_STR(FP_DTYPE) ",FP_HEADDIM=" FP_EMU_STR(FP_HEADDIM) ",FP_BLOCK_N=" FP_EMU_STR(
        FP_BLOCK_N) ",FP_WARPS=" FP_EMU_STR(FP_WARPS) ",FP_STAGES=" FP_EMU_STR(FP_STAGES)
        FP_EMU_FP8_SUFFIX FP_EMU_DECODE_SUFFIX FP_EMU_MIN_BLOCKS_SUFFIX FP_EMU_BULK_SUFFIX
            FP_EMU_CLUSTER_SUFFIX,
    trampoline);
}  // namespace
