// The wave layer on AMD CDNA through HIP (gfx90a: CDNA2, MI200; gfx940/941/942: CDNA3, MI300). Wave64,
// MFMA compiler builtins (the compiler schedules their hazards, unlike inline asm), __shfl_xor with an
// explicit width: HIP 5.2 has no *_sync shuffles, and a wave runs in lockstep, so all lanes take part.
// Included through wave.hpp only.
#pragma once

#define FP_DEV __device__ __forceinline__

namespace flashport::wave {

inline constexpr int kWaveSize = 64;

FP_DEV int thread_id() {
  return (int)threadIdx.x;
}
FP_DEV int lane_id() {
  return (int)threadIdx.x & (kWaveSize - 1);
}
/// Read from lane 0 so the compiler keeps it (and what derives from it) in scalar registers.
FP_DEV int wave_id() {
  return __builtin_amdgcn_readfirstlane((int)threadIdx.x / kWaveSize);
}
FP_DEV unsigned block_x() {
  return blockIdx.x;
}
FP_DEV unsigned block_y() {
  return blockIdx.y;
}
FP_DEV unsigned block_z() {
  return blockIdx.z;
}
FP_DEV unsigned grid_x() {
  return gridDim.x;
}
FP_DEV unsigned grid_y() {
  return gridDim.y;
}

FP_DEV void block_sync() {
  __syncthreads();
}

FP_DEV float shfl_xor(float v, int mask, int width) {
  return __shfl_xor(v, mask, width);
}

FP_DEV bool wave_all(bool v) {
  return __all(v);
}

FP_DEV float exp2(float x) {
  return exp2f(x);
}
FP_DEV float log(float x) {
  return logf(x);
}
FP_DEV float log2(float x) {
  return log2f(x);
}
FP_DEV u16 f16_bits(float x) {
  return __builtin_bit_cast(u16, (_Float16)x);
}

/// HIP's atomicAdd on float: global_atomic_add_f32 when compiled with -munsafe-fp-atomics (the
/// backward's code objects are: its dQ accumulator is coarse-grained device memory, where the
/// instruction is exact), a compare-and-swap loop otherwise.
FP_DEV void atomic_add_f32(float* addr, float v) {
  atomicAdd(addr, v);
}

FP_DEV bool claim_flag(int* addr) {
  return atomicCAS(addr, 0, 1) == 0;
}
FP_DEV void fence_system() {
  __threadfence_system();
}

namespace cdna {
typedef short i16x4_ext __attribute__((ext_vector_type(4)));
typedef _Float16 f16x4_ext __attribute__((ext_vector_type(4)));
typedef float f32x4_ext __attribute__((ext_vector_type(4)));
}  // namespace cdna

struct bf16;
struct f16;

/// v_mfma_f32_16x16x16bf16_1k (gfx90a; v_mfma_f32_16x16x16_bf16 on gfx94x). CBSZ/ABID/BLGP = 0.
FP_DEV f32x4 mfma16(const bf16&, u16x4 a, u16x4 b, f32x4 c) {
  using namespace cdna;
  return __builtin_bit_cast(f32x4, __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(
                                       __builtin_bit_cast(i16x4_ext, a), __builtin_bit_cast(i16x4_ext, b),
                                       __builtin_bit_cast(f32x4_ext, c), 0, 0, 0));
}
/// v_mfma_f32_16x16x16f16 (gfx90a and gfx94x).
FP_DEV f32x4 mfma16(const f16&, u16x4 a, u16x4 b, f32x4 c) {
  using namespace cdna;
  return __builtin_bit_cast(f32x4, __builtin_amdgcn_mfma_f32_16x16x16f16(
                                       __builtin_bit_cast(f16x4_ext, a), __builtin_bit_cast(f16x4_ext, b),
                                       __builtin_bit_cast(f32x4_ext, c), 0, 0, 0));
}

}  // namespace flashport::wave
