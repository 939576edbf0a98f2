// Shared-memory addressing, cp.async (16-byte, zero-fill predicated) and 16-byte global loads/stores.
#pragma once

#include "cuda/common/types.cuh"

namespace flashport::cuda {

/// Sixteen bytes in four registers (one cp.async / vector access unit: 8 fp16/bf16 elements).
struct alignas(16) U32x4 {
  u32 x, y, z, w;
};

/// The block's dynamic shared memory (the launch's dynamic size), 16-byte aligned, viewed as T.
template <class T>
FP_DEV T* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char fp_dynamic_smem[];
  return reinterpret_cast<T*>(fp_dynamic_smem);
}

/// The 32-bit shared-state-space address of a generic pointer into shared memory.
FP_DEV u32 smem_addr(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

/// Asynchronous 16-byte copy global -> shared (L2 only, .cg). When `pred` is false nothing is read
/// and the 16 shared bytes are zero-filled; `g_src` must still be a valid pointer value (callers pass
/// the tensor base). Both addresses must be 16-byte aligned.
FP_DEV void cp_async_16(u32 s_dst, const void* g_src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s_dst), "l"(g_src), "r"(pred ? 16 : 0)
               : "memory");
}

/// cp_async_16 with the predicate as cp.async's ignore-src operand (no 16-or-0 size to compute): `zero`
/// copies 16 zero bytes and reads nothing; `g_src` must still be a valid pointer value.
FP_DEV void cp_async_16_or_zero(u32 s_dst, const void* g_src, bool zero) {
  asm volatile(
      "{ .reg .pred z; setp.ne.b32 z, %2, 0; cp.async.cg.shared.global [%0], [%1], 16, z; }" ::"r"(s_dst),
      "l"(g_src), "r"((int)zero)
      : "memory");
}

/// Closes the current group of cp.async operations.
FP_DEV void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

/// Waits until at most `N` committed groups are still in flight (this thread's copies only; a
/// __syncthreads must follow before other threads read the data).
template <int N>
FP_DEV void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/// Waits for every committed group of this thread.
FP_DEV void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

/// 16-byte global load (address 16-byte aligned).
FP_DEV U32x4 ld_global_16(const void* g) {
  U32x4 v;
  asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(g));
  return v;
}

/// 16-byte global store (address 16-byte aligned).
FP_DEV void st_global_16(void* g, const U32x4& v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(g), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

/// 16-byte shared load / store through 32-bit shared addresses.
FP_DEV U32x4 ld_shared_16(u32 s) {
  U32x4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(s));
  return v;
}
FP_DEV void st_shared_16(u32 s, const U32x4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(s), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

/// True when `p` is 16-byte aligned.
FP_DEV bool aligned16(const void* p) {
  return ((u64)p & 15u) == 0;
}

}  // namespace flashport::cuda
