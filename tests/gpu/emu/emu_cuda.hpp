// Prelude force-included (-include) before a CUDA kernel source compiled as host C++ for the
// emulator: CUDA keywords and builtins mapped onto emu_runtime's cooperative threads.
#pragma once

#include <math.h>

#include <cmath>
#include <cstring>

#include "core/problem.h"

namespace flashport::emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};

/// The emulated thread running now (thread index within its block).
const Dim3& thread_index();
extern Dim3 g_block_index, g_grid_dim, g_block_dim;

void sync_block();  // __syncthreads: every live thread of the block
void sync_warp();   // __syncwarp: every live lane of the calling warp
/// The block's dynamic shared memory.
unsigned char* dynamic_shared();

}  // namespace flashport::emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static
#define threadIdx (::flashport::emu::thread_index())
#define blockIdx (::flashport::emu::g_block_index)
#define gridDim (::flashport::emu::g_grid_dim)
#define blockDim (::flashport::emu::g_block_dim)
#define __syncthreads() ::flashport::emu::sync_block()
#define __syncwarp(...) ::flashport::emu::sync_warp()

// Emulated threads take turns (they switch only at barriers), so an atomic is a plain read-modify-write
// and a fence has nothing left to order (index_report.cuh's fault claim).
inline int atomicCAS(int* address, int compare, int value) {
  const int old = *address;
  if (old == compare) *address = value;
  return old;
}
inline void __threadfence_system() {}
inline void __threadfence() {}

namespace flashport::emu {
long long shfl_i64(long long v, int src);  // value of lane src (all 32 lanes take part)
}
template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
  static_assert(sizeof(T) <= 8, "__shfl_sync of a 4- or 8-byte value");
  long long bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = ::flashport::emu::shfl_i64(bits, src & 31);
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}
inline int __any_sync(unsigned, int pred) {
  unsigned x = pred ? 1u : 0u;
  for (int m = 1; m < 32; m <<= 1) x |= (unsigned)::flashport::emu::shfl_i64(x, (int)(threadIdx.x % 32) ^ m);
  return x != 0;
}
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Inline PTX left in a kernel: the empty statements that pin registers against the compiler's code motion
// (`asm volatile("" : "+r"(x))`) mean nothing here and are dropped; any other (PTX the stand-in headers do
// not provide) stops the emulated kernel when it runs.
namespace flashport::emu {
void inline_ptx(const char* text);
}
#define asm
#define volatile(...) ::flashport::emu::inline_ptx(#__VA_ARGS__)

inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
// fmaxf / logf come from <math.h> (through <cmath>) in the global namespace.
