// The wave layer on the CPU: a wave64 execution model. Every lane is a cooperative fiber; a block's
// LDS is a byte array; block_sync is a phase point that every live lane of the block reaches; each
// wave-wide instruction (shfl_xor, mfma16) gathers the operands of the wave's 64 lanes and computes
// what AMD documents for it (mfma_layout.hpp). A kernel written over wave.hpp compiles unchanged with
// g++ against this header (define FP_WAVE_MODEL) and runs on small problems, so fragment-layout,
// masking, indexing and barrier mistakes show up without an AMD GPU. Slow by design (a context switch
// per lane per collective). Not thread-safe: one launch at a time per process.
#pragma once

#include <cmath>
#include <cstring>
#include <functional>

#define FP_DEV inline

namespace flashport::wave {

namespace model {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

inline constexpr int kSlotBytes = 64;  // what one lane may contribute to a wave collective

int thread_id();
Dim3 block_index();
Dim3 grid_dim();
/// Every live lane of the block arrives before any continues.
void block_sync();
/// Wave collective, first half: this lane's `bytes` go to its slot; returns the wave's 64 slots
/// (kSlotBytes apart) once every lane of the wave has arrived. Fails (abort with a message) when a
/// lane of the wave has exited: the hardware would read undefined values from it.
const unsigned char* wave_gather(const void* mine, int bytes);
/// Second half: returns once every lane of the wave has read the slots.
void wave_release();

/// Runs `kernel(lds)` over `grid` blocks of `threads` lanes (a multiple of 64), one block at a time in a
/// shuffled order, lanes interleaved in a shuffled order. Each block gets `lds_bytes` (<= 64 KiB, CDNA's
/// per-workgroup LDS) of LDS filled with 0xFF bytes (NaN as floats) so reads of unwritten LDS cannot pass a
/// test. Aborts on a deadlock (lanes waiting at barriers that cannot complete).
void launch(Dim3 grid, int threads, int lds_bytes, const std::function<void(unsigned char* lds)>& kernel);

/// Wave collectives executed since the process started (cost accounting in tests).
long long collectives();

}  // namespace model

inline constexpr int kWaveSize = 64;

FP_DEV int thread_id() {
  return model::thread_id();
}
FP_DEV int lane_id() {
  return model::thread_id() & (kWaveSize - 1);
}
FP_DEV int wave_id() {
  return model::thread_id() / kWaveSize;
}
FP_DEV unsigned block_x() {
  return model::block_index().x;
}
FP_DEV unsigned block_y() {
  return model::block_index().y;
}
FP_DEV unsigned block_z() {
  return model::block_index().z;
}
FP_DEV unsigned grid_x() {
  return model::grid_dim().x;
}
FP_DEV unsigned grid_y() {
  return model::grid_dim().y;
}
FP_DEV void block_sync() {
  model::block_sync();
}

/// HIP's rule (amd_warp_functions.h): the source is lane ^ mask unless that leaves the caller's
/// width-aligned segment, in which case the caller reads its own value.
FP_DEV float shfl_xor(float v, int mask, int width) {
  const int lane = lane_id();
  int src = lane ^ mask;
  if (src >= ((lane + width) & ~(width - 1))) src = lane;
  const unsigned char* slots = model::wave_gather(&v, sizeof v);
  float r;
  std::memcpy(&r, slots + src * model::kSlotBytes, sizeof r);
  model::wave_release();
  return r;
}

FP_DEV bool wave_all(bool v) {
  const unsigned char* slots = model::wave_gather(&v, sizeof v);
  bool all = true;
  for (int lane = 0; lane < kWaveSize; ++lane) all = all && slots[lane * model::kSlotBytes] != 0;
  model::wave_release();
  return all;
}

FP_DEV float exp2(float x) {
  return std::exp2(x);
}
FP_DEV float log(float x) {
  return std::log(x);
}
FP_DEV float log2(float x) {
  return std::log2(x);
}
FP_DEV u16 f16_bits(float x) {
  return num::f32_to_f16(x);
}

/// Lanes run one at a time and switch only inside block_sync and wave collectives, so a plain add is
/// already atomic in the model.
FP_DEV void atomic_add_f32(float* addr, float v) {
  *addr += v;
}
/// Lanes switch only at barriers and collectives, so a plain test-and-set is atomic here.
FP_DEV bool claim_flag(int* addr) {
  if (*addr != 0) return false;
  *addr = 1;
  return true;
}
FP_DEV void fence_system() {}

/// One 16x16x16 MFMA over the wave: lane l's D registers are the mfma_layout.hpp elements of
/// A B + C, with A and B gathered from the lanes that hold them. 16-bit products are exact in fp32;
/// they are summed in k order in fp32 and added to C (the hardware's internal order is not
/// documented, so tests compare against the accuracy rule, not bits).
template <class Elem>
FP_DEV f32x4 mfma16(const Elem&, u16x4 a, u16x4 b, f32x4 c) {
  struct Operands {
    u16x4 a, b;
  };
  static_assert(sizeof(Operands) <= model::kSlotBytes);
  const Operands mine{a, b};
  const unsigned char* slots = model::wave_gather(&mine, sizeof mine);
  auto at = [&](int lane) {
    Operands o;
    std::memcpy(&o, slots + lane * model::kSlotBytes, sizeof o);
    return o;
  };
  auto value = [](u16 bits) { return Elem::kElemType == 3 ? num::bf16_to_f32(bits) : num::f16_to_f32(bits); };
  const int lane = lane_id();
  f32x4 d;
  for (int r = 0; r < layout16::kElems; ++r) {
    const layout16::Coord out = layout16::cd_elem(lane, r);
    float sum = 0.0f;
    for (int k = 0; k < layout16::kK; ++k)
      sum +=
          value(at(layout16::a_lane(out.row, k)).a[k & 3]) * value(at(layout16::b_lane(k, out.col)).b[k & 3]);
    d[r] = c[r] + sum;
  }
  model::wave_release();
  return d;
}

}  // namespace flashport::wave
