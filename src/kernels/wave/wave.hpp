// The vendor layer of the wave-level kernels: the few GPU primitives an attention kernel needs, each
// with one meaning and one implementation per target, so a kernel is written once over them.
//
// Contract (every target provides, in namespace flashport::wave):
//   FP_DEV                       qualifier of device functions
//   kWaveSize                    lanes per wave (64 on CDNA)
//   thread_id(), lane_id(), wave_id()   this lane in its 1-D block; wave_id is wave-uniform
//   block_x(), block_y(), block_z(), grid_x(), grid_y()   the block's position and the grid's x / y extents
//   block_sync()                 every lane of the block reaches this point before any passes it; LDS
//                                writes before it are visible after it (s_barrier + LDS wait)
//   shfl_xor(v, mask, width)     v of lane (lane ^ mask) within the caller's width-aligned segment
//                                (HIP __shfl_xor semantics; every lane of the wave takes part)
//   wave_all(v)                  whether v holds on every lane of the caller's wave (HIP __all; every
//                                lane of the wave takes part)
//   mfma16(Elem, a, b, c)        D = A B + C for one 16x16x16 tile, fp32 accumulate, fragments laid
//                                out as mfma_layout.hpp documents; every lane of the wave takes part
//   exp2(x), log(x), log2(x)     fp32 2^x, natural log and log2
//   f16_bits(x)                  fp32 -> IEEE fp16 bits, round to nearest even
//   atomic_add_f32(addr, v)      *addr += v on global fp32 memory as one atomic update (lanes and
//                                blocks may add to the same address; the order of the adds is not
//                                defined, so the sum's rounding is not either)
//   claim_flag(addr)             atomically sets the global int *addr from 0 to 1; true for the one
//                                lane (of all blocks) that did it (HIP atomicCAS)
//   fence_system()               this lane's global writes before it are visible to the host before
//                                any after it (HIP __threadfence_system)
// LDS is plain memory reached through a `unsigned char* lds` the kernel entry passes in (a static
// __shared__ array on the GPU, a byte array in the model), so kernels address it like any buffer.
//
// Targets: cdna.hpp (HIP, gfx90a / gfx94x), model.hpp (the CPU wave64 model, FP_WAVE_MODEL). The CUDA
// portable kernels do not run on this layer; they share the algorithm's stages with the CDNA kernels
// through kernels/attn/ instead (docs/ARCHITECTURE.md, "What the CDNA and CUDA portable kernels share").
#pragma once

#include "core/numeric.h"
#include "wave/mfma_layout.hpp"
#include "wave/types.hpp"

#if defined(__HIPCC__)
#include "wave/cdna.hpp"
#elif defined(FP_WAVE_MODEL)
#include "wave/model.hpp"
#else
#error "wave layer: compile as HIP (hipcc, clang -x hip) or define FP_WAVE_MODEL for the CPU model"
#endif

namespace flashport::wave {

/// bf16 inputs: the element tag that picks the MFMA form and the output rounding.
struct bf16 {
  static constexpr int kElemType = 3;  // flashport::kBF16
  static FP_DEV u16 from_float(float x) { return num::f32_to_bf16(x); }
};
/// fp16 inputs.
struct f16 {
  static constexpr int kElemType = 2;  // flashport::kF16
  static FP_DEV u16 from_float(float x) { return f16_bits(x); }
};

/// Max of v over the lanes that differ from this one in the bits of `masks` (a butterfly: every
/// participating lane ends with the same value).
template <int... kMasks>
FP_DEV float max_over(float v) {
  ((v = fmaxf(v, shfl_xor(v, kMasks, kWaveSize))), ...);
  return v;
}
/// Sum of v over the same butterfly.
template <int... kMasks>
FP_DEV float sum_over(float v) {
  ((v += shfl_xor(v, kMasks, kWaveSize)), ...);
  return v;
}

}  // namespace flashport::wave
