// The Hopper (sm_90a) side of the CUDA emulator: mbarriers, TMA tensor loads through a stand-in
// cuTensorMapEncodeTiled, bulk copies and reductions, and wgmma reading its shared-memory operands through
// their matrix descriptors (PTX ISA "Shared Memory Matrix Layout", 128- and 64-byte swizzles). Everything
// asynchronous on the GPU completes when issued here; waits order the emulated threads (emu_runtime.cpp).
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/numeric.h"
#include "emu_cuda.hpp"
#include "emu_sm90.hpp"
#include "jit/jit.hpp"

namespace flashport::emu {

// emu_runtime.cpp
[[noreturn]] void die(const std::string& msg);
void warp_gather(const void* in, size_t bytes, void* out);

namespace {

// ---------------------------------------------------------------------------------------------
// mbarriers: the 8 bytes hold {expected arrivals, pending arrivals, phase number, initialised} and the
// signed transaction bytes still to come. Shared memory starts as 0xff bytes, so an uninitialised barrier
// has its kUninit bit set.

struct MBar {
  uint32_t bits;  // 0-11 expected, 12-23 pending, 24-29 phase number (mod 64), 30 uninitialised
  int32_t tx;
};
constexpr uint32_t kCountMask = 0xfffu, kUninit = 1u << 30;
constexpr const char* kParityWait[2] = {"mbarrier (parity 0)", "mbarrier (parity 1)"};
uint32_t phase_of(const MBar& m) {
  return (m.bits >> 24) & 63u;
}

MBar load_bar(unsigned bar) {
  MBar m;
  std::memcpy(&m, shared_at(bar, 8), 8);
  if (m.bits & kUninit) die("mbarrier at " + std::to_string(bar & 0xffffffu) + " used before mbar_init");
  return m;
}
void store_bar(unsigned bar, const MBar& m) {
  std::memcpy(shared_at(bar, 8), &m, 8);
}
/// Completes the phase once every arrival and every transaction byte is in.
void settle(unsigned bar, MBar m) {
  const uint32_t expected = m.bits & kCountMask, pending = (m.bits >> 12) & kCountMask;
  if (pending == 0 && m.tx == 0) m.bits = ((phase_of(m) + 1) & 63u) << 24 | expected << 12 | expected;
  store_bar(bar, m);
  progress();
}
void complete_tx(unsigned bar, unsigned bytes) {
  MBar m = load_bar(bar);
  m.tx -= (int32_t)bytes;
  settle(bar, m);
}

// ---------------------------------------------------------------------------------------------
// The stand-in tensor map (written into the CUtensorMap's 128 bytes).

struct EmuTensorMap {
  uint64_t magic;
  const unsigned char* base;
  uint64_t dims[4], strides[4];  // strides[0]: the element size
  uint32_t box[4], swizzle;
};
static_assert(sizeof(EmuTensorMap) <= sizeof(CUtensorMap));
constexpr uint64_t kMapMagic = 0x656d75746d617030ull;

CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                      const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                      const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                      CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) {
  const unsigned elem = type == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1
                        : type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                            ? 2
                            : 0;
  const unsigned span = swizzle == CU_TENSOR_MAP_SWIZZLE_128B  ? 128
                        : swizzle == CU_TENSOR_MAP_SWIZZLE_64B ? 64
                                                               : 0;
  if (rank != 4 || elem == 0 || span == 0 || interleave != CU_TENSOR_MAP_INTERLEAVE_NONE ||
      oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE || reinterpret_cast<uintptr_t>(address) % 16 != 0)
    return CUDA_ERROR_INVALID_VALUE;
  EmuTensorMap m{kMapMagic, static_cast<const unsigned char*>(address), {}, {elem}, {}, span};
  for (int i = 0; i < 4; ++i) {
    if (dims[i] == 0 || box[i] == 0 || box[i] > 256 || element_strides[i] != 1)
      return CUDA_ERROR_INVALID_VALUE;
    m.dims[i] = dims[i], m.box[i] = box[i];
    if (i > 0) {
      if (strides[i - 1] % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
      m.strides[i] = strides[i - 1];
    }
  }
  // The swizzle span bounds the inner box dimension (the kernels fill it exactly).
  if (box[0] * elem > span) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, sizeof *map);
  std::memcpy(map, &m, sizeof m);
  return CUDA_SUCCESS;
}

/// The byte address after the 128B (Swizzle<3,4,3>) or 64B (Swizzle<2,4,3>) pattern: 16-byte unit bits
/// 4-6 (4-5) XOR address bits 7-9 (7-8), as TMA writes and wgmma reads a 1024- (512-) byte aligned atom.
unsigned swizzled(unsigned addr, unsigned span) {
  const unsigned mask = span == 128 ? 7u : 3u;
  return addr ^ (((addr >> 7) & mask) << 4);
}

// ---------------------------------------------------------------------------------------------
// wgmma operands.

struct Desc {
  unsigned start, lbo, sbo, span;
};
Desc decode(unsigned long long desc) {
  const unsigned mode = (unsigned)(desc >> 62);
  if (((desc >> 49) & 7u) != 0) die("wgmma descriptor with a nonzero base offset");
  if (mode != 1 && mode != 2)
    die("wgmma descriptor swizzle mode " + std::to_string(mode) + " (1 = 128B, 2 = 64B)");
  return {(unsigned)(desc & 0x3fffu) << 4, (unsigned)((desc >> 16) & 0x3fffu) << 4,
          (unsigned)((desc >> 32) & 0x3fffu) << 4, mode == 1 ? 128u : 64u};
}

/// Shared byte address of element (mn, k) of an operand: K-major rows of `span` bytes along K, eight
/// rows per atom and atoms SBO apart along MN; MN-major rows of `span` bytes along MN (atoms LBO apart),
/// eight of them along K per atom and atoms SBO apart along K.
unsigned operand_addr(const Desc& d, bool mn_major, int mn, int k, int elem) {
  unsigned addr;
  if (mn_major) {
    const int per_row = (int)d.span / elem;
    addr = d.start + (unsigned)(mn / per_row) * d.lbo + (unsigned)(k / 8) * d.sbo +
           (unsigned)(k % 8) * d.span + (unsigned)(mn % per_row * elem);
  } else {
    addr = d.start + (unsigned)(mn / 8) * d.sbo + (unsigned)(mn % 8) * d.span + (unsigned)(k * elem);
  }
  return swizzled(addr, d.span);
}

float element(MmaType type, const unsigned char* p) {
  if (type == MmaType::kE4M3) return num::fp8_to_f32(*p, num::kE4M3);
  uint16_t h;
  std::memcpy(&h, p, 2);
  return type == MmaType::kBF16 ? num::bf16_to_f32(h) : num::f16_to_f32(h);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void mbar_init(unsigned bar, unsigned count) {
  if (count == 0 || count > kCountMask) die("mbar_init count " + std::to_string(count));
  store_bar(bar, MBar{count << 12 | count, 0});
}

void mbar_arrive(unsigned bar, unsigned count, unsigned tx_bytes) {
  MBar m = load_bar(bar);
  const uint32_t pending = (m.bits >> 12) & kCountMask;
  if (count > pending)
    die("mbarrier at " + std::to_string(bar & 0xffffffu) + ": more arrivals than expected");
  m.bits = (m.bits & ~(kCountMask << 12)) | (pending - count) << 12;
  m.tx += (int32_t)tx_bytes;
  settle(bar, m);
}

bool mbar_try_wait(unsigned bar, unsigned parity) {
  if ((phase_of(load_bar(bar)) & 1u) != (parity & 1u)) return true;
  spin(kParityWait[parity & 1u], bar);
  return false;
}

void mbar_wait(unsigned bar, unsigned parity) {
  // The phase this thread waits for ends when the phase number moves on, however far: its warp-mates (which
  // run in step on the GPU) may have passed and let the barrier complete again before this thread polls.
  const uint32_t waiting = phase_of(load_bar(bar));
  if ((waiting & 1u) != (parity & 1u)) return;
  while (phase_of(load_bar(bar)) == waiting) spin(kParityWait[parity & 1u], bar);
}

void tma_load_4d(unsigned dst, const void* desc, unsigned bar, int c0, int c1, int c2, int c3) {
  EmuTensorMap m;
  std::memcpy(&m, desc, sizeof m);
  if (m.magic != kMapMagic) die("TMA load through a tensor map the emulator did not encode");
  const unsigned elem = (unsigned)m.strides[0];
  const unsigned total = m.box[0] * m.box[1] * m.box[2] * m.box[3] * elem;
  if (dst % 128 != 0) die("TMA destination not 128-byte aligned");
  unsigned char* smem = shared_at(dst, total);  // bounds
  const int c[4] = {c0, c1, c2, c3};
  unsigned lin = 0;
  for (unsigned i3 = 0; i3 < m.box[3]; ++i3)
    for (unsigned i2 = 0; i2 < m.box[2]; ++i2)
      for (unsigned i1 = 0; i1 < m.box[1]; ++i1)
        for (unsigned i0 = 0; i0 < m.box[0]; ++i0, lin += elem) {
          const long long x[4] = {(long long)c[0] + i0, (long long)c[1] + i1, (long long)c[2] + i2,
                                  (long long)c[3] + i3};
          unsigned char* out = smem + (swizzled(dst + lin, m.swizzle) - dst);
          bool inside = true;
          long long offset = 0;
          for (int i = 0; i < 4; ++i) {
            inside = inside && x[i] >= 0 && x[i] < (long long)m.dims[i];
            offset += x[i] * (long long)(i == 0 ? elem : m.strides[i]);
          }
          if (inside)
            std::memcpy(out, m.base + offset, elem);
          else
            std::memset(out, 0, elem);  // out of bounds: zero fill, still counted
        }
  complete_tx(bar, total);
}

void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) die("bulk copy not in 16-byte units");
  std::memcpy(shared_at(dst, bytes), src, bytes);
  complete_tx(bar, bytes);
}

void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
  if (bytes % 16 != 0 || reinterpret_cast<uintptr_t>(dst) % 16 != 0)
    die("bulk reduce-add not in 16-byte units");
  const unsigned char* s = shared_at(src, bytes);
  for (unsigned i = 0; i < bytes / 4; ++i) {
    float v;
    std::memcpy(&v, s + 4 * i, 4);
    dst[i] += v;
  }
}

void st_async(unsigned dst, const float* v, int count, unsigned bar) {
  std::memcpy(shared_at(dst, 4u * count), v, 4u * count);
  complete_tx(bar, 4u * count);
}

void wgmma(MmaType type, int n, float* d, unsigned long long desc_a, bool a_mn, const unsigned* a_regs,
           unsigned long long desc_b, bool b_mn, unsigned scale_d) {
  const int elem = type == MmaType::kE4M3 ? 1 : 2, k_steps = 32 / elem;
  const unsigned tid = thread_index().x, lane = tid % 32, warp = (tid % 128) / 32, g = lane / 4, t = lane % 4;
  // A rows 16 warp + g and + 8: from the warp's register fragments (every lane takes part) or shared memory.
  float a[2][32];
  if (a_regs) {
    unsigned all[32][4];
    warp_gather(a_regs, sizeof(unsigned[4]), all);
    for (int h = 0; h < 2; ++h)
      for (unsigned src = 0; src < 4; ++src) {
        const unsigned* r = all[4 * g + src];
        for (int half = 0; half < 2; ++half) {  // registers h (first k half) and 2 + h (second)
          const unsigned reg = r[2 * half + h];
          if (elem == 2) {
            for (int e = 0; e < 2; ++e) {
              const uint16_t bits = (uint16_t)(reg >> (16 * e));
              a[h][8 * half + 2 * src + e] = element(type, reinterpret_cast<const unsigned char*>(&bits));
            }
          } else {
            for (int e = 0; e < 4; ++e) {
              const unsigned char byte = (unsigned char)(reg >> (8 * e));
              a[h][16 * half + 4 * src + e] = element(type, &byte);
            }
          }
        }
      }
  } else {
    const Desc da = decode(desc_a);
    for (int h = 0; h < 2; ++h)
      for (int k = 0; k < k_steps; ++k)
        a[h][k] = element(type, shared_at(operand_addr(da, a_mn, (int)(16 * warp + g + 8 * h), k, elem), 1));
  }
  const Desc db = decode(desc_b);
  for (int j = 0; j < n / 8; ++j)
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * j + 2 * (int)t + e;
      float b[32];
      for (int k = 0; k < k_steps; ++k)
        b[k] = element(type, shared_at(operand_addr(db, b_mn, col, k, elem), 1));
      for (int h = 0; h < 2; ++h) {
        float acc = scale_d ? d[4 * j + 2 * h + e] : 0.0f;
        for (int k = 0; k < k_steps; ++k) acc += a[h][k] * b[k];
        d[4 * j + 2 * h + e] = acc;
      }
    }
}

void inline_ptx(const char* text) {
  if (std::strncmp(text, "\"\"", 2) != 0) die(std::string("inline PTX without an emulation: ") + text);
}

}  // namespace flashport::emu

namespace flashport::jit {
void* tensor_map_encoder() {
  return reinterpret_cast<void*>(&emu::encode_tiled);
}
}  // namespace flashport::jit
