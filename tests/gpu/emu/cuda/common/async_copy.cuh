// Emulator stand-in for cuda/common/async_copy.cuh: cp.async queued per thread and performed at
// issue (eager) or when its group retires (lazy), so missing waits or early overwrites show up.
#pragma once

#include <cstring>

#include "cuda/common/types.cuh"

namespace flashport::emu {
void cp_async(void* smem_dst, const void* src, bool pred);
void cp_async_commit();
void cp_async_wait(int pending);  // retire groups until at most `pending` remain
unsigned char* dynamic_shared();
}  // namespace flashport::emu

namespace flashport::cuda {

struct alignas(16) U32x4 {
  u32 x, y, z, w;
};

template <class T>
inline T* dynamic_smem() {
  return reinterpret_cast<T*>(emu::dynamic_shared());
}
/// Shared "addresses" are byte offsets into the emulated dynamic shared memory.
inline u32 smem_addr(const void* p) {
  return (u32)(static_cast<const unsigned char*>(p) - emu::dynamic_shared());
}
inline void cp_async_16(u32 s_dst, const void* g_src, bool pred) {
  emu::cp_async(emu::dynamic_shared() + s_dst, g_src, pred);
}
inline void cp_async_16_or_zero(u32 s_dst, const void* g_src, bool zero) {
  emu::cp_async(emu::dynamic_shared() + s_dst, g_src, !zero);
}
inline void cp_async_commit() {
  emu::cp_async_commit();
}
template <int N>
inline void cp_async_wait() {
  emu::cp_async_wait(N);
}
inline void cp_async_wait_all() {
  emu::cp_async_wait(0);
}
inline U32x4 ld_global_16(const void* g) {
  U32x4 v;
  std::memcpy(&v, g, 16);
  return v;
}
inline void st_global_16(void* g, const U32x4& v) {
  std::memcpy(g, &v, 16);
}
inline U32x4 ld_shared_16(u32 s) {
  U32x4 v;
  std::memcpy(&v, emu::dynamic_shared() + s, 16);
  return v;
}
inline void st_shared_16(u32 s, const U32x4& v) {
  std::memcpy(emu::dynamic_shared() + s, &v, 16);
}
inline bool aligned16(const void* p) {
  return ((u64)p & 15u) == 0;
}

}  // namespace flashport::cuda
