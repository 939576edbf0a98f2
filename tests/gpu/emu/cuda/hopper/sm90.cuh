// Emulator stand-in for cuda/hopper/sm90.cuh: the same primitives over emu_sm90.cpp. mbarriers keep their
// state in their own 8 bytes of shared memory; TMA and bulk copies, reductions and wgmma (wgmma.cuh) run to
// completion when issued, so their completion waits only order the emulated threads. A cluster's CTAs run
// together (emu_runtime.cpp's run_cluster), each with its own shared memory; a shared::cluster address is a
// CTA's shared offset tagged with (rank + 1) << 24.
#pragma once

#include "cuda/common/async_copy.cuh"
#include "cuda/hopper/sm90_config.h"
#include "emu_sm90.hpp"

namespace flashport::cuda::sm90 {

inline void mbar_init(u32 bar, u32 count) {
  emu::mbar_init(bar, count);
}
inline void fence_barrier_init() {}
inline void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  emu::mbar_arrive(bar, 1, bytes);
}
inline void mbar_arrive(u32 bar) {
  emu::mbar_arrive(bar, 1, 0);
}
inline void mbar_arrive_count(u32 bar, u32 count) {
  emu::mbar_arrive(bar, count, 0);
}
/// cp.async copies complete when issued (eager) or when their group retires: the arrival then waits for
/// the calling thread's groups, as cp.async.mbarrier.arrive does.
inline void mbar_arrive_cp_async(u32 bar) {
  emu::cp_async_wait(0);
  emu::mbar_arrive(bar, 1, 0);
}
template <bool kCluster = false>
inline bool mbar_try_wait(u32 bar, u32 parity) {
  return emu::mbar_try_wait(bar, parity);
}
inline void mbar_wait(u32 bar, u32 parity) {
  emu::mbar_wait(bar, parity);
}

inline void tma_load_4d(u32 dst, const hopper::TmaDesc& desc, u32 bar, int c0, int c1, int c2, int c3) {
  emu::tma_load_4d(dst, &desc, bar, c0, c1, c2, c3);
}
inline void tma_load_chunk(u32 dst, const hopper::TmaDesc& desc, const hopper::TmaDims& dims, u32 bar,
                           int column, int head, int row, int batch) {
  const hopper::TmaOuter c = hopper::outer_coords(dims, head, row, batch);
  tma_load_4d(dst, desc, bar, column, c.c1, c.c2, c.c3);
}
inline void tma_prefetch_desc(const hopper::TmaDesc&) {}
inline void fence_proxy_async() {}
inline void fence_proxy_async_global() {}

inline void bulk_load(u32 s_dst, const void* g_src, u32 bytes, u32 bar) {
  emu::bulk_load(s_dst, g_src, bytes, bar);
}
inline void bulk_reduce_add_f32(float* g_dst, u32 s_src, u32 bytes) {
  emu::bulk_reduce_add_f32(g_dst, s_src, bytes);
}
inline void bulk_commit() {}
template <int kPending>
inline void bulk_wait_read() {}
template <int kPending>
inline void bulk_wait_complete() {}
inline void bulk_wait_all() {}

inline u32 cluster_rank() {
  return emu::cluster_rank();
}
inline u32 cluster_size() {
  return emu::cluster_size();
}
inline void cluster_sync() {
  emu::sync_cluster();
}
inline u32 peer_addr(u32 s_addr, u32 rank) {
  return s_addr | (rank + 1) << 24;
}
inline float ld_cluster_f32(u32 cluster_addr) {
  return emu::ld_cluster_f32(cluster_addr);
}
inline void mbar_arrive_peer(u32 cluster_bar) {
  emu::mbar_arrive(cluster_bar, 1, 0);
}
inline void mbar_wait_cluster(u32 bar, u32 parity) {
  mbar_wait(bar, parity);
}
inline void st_async_8(u32 dst, float a, float b, u32 cluster_bar) {
  const float v[2] = {a, b};
  emu::st_async(dst, v, 2, cluster_bar);
}
inline void st_async_16(u32 dst, float a, float b, float c, float d, u32 cluster_bar) {
  const float v[4] = {a, b, c, d};
  emu::st_async(dst, v, 4, cluster_bar);
}

inline void st_shared_u32(u32 s_addr, u32 v) {
  std::memcpy(emu::shared_at(s_addr, 4), &v, 4);
}
inline void st_shared_f32x2(u32 s_addr, float x, float y) {
  const float v[2] = {x, y};
  std::memcpy(emu::shared_at(s_addr, 8), v, 8);
}
inline void st_shared_f32x4(u32 s_addr, float a, float b, float c, float d) {
  const float v[4] = {a, b, c, d};
  std::memcpy(emu::shared_at(s_addr, 16), v, 16);
}
inline Float2 ld_shared_f32x2(u32 s_addr) {
  Float2 v;
  std::memcpy(&v, emu::shared_at(s_addr, 8), 8);
  return v;
}
inline void ld_shared_f32x4(u32 s_addr, float (&v)[4]) {
  std::memcpy(v, emu::shared_at(s_addr, 16), 16);
}
inline int ld_volatile_shared_s32(u32 s_addr) {
  int v;
  std::memcpy(&v, emu::shared_at(s_addr, 4), 4);
  return v;
}
inline void red_add_f32x2_if(bool pred, float* g, Float2 v) {
  if (pred) g[0] += v.x, g[1] += v.y;
}
/// A poll that finds the turn not yet reached lets the other threads run.
inline int ld_acquire_gpu_s32(const int* g) {
  emu::spin("global counter", 0);
  return *g;
}
inline void red_release_gpu_inc(int* g) {
  ++*g;
  emu::progress();
}
inline int tid_x_volatile() {
  return (int)threadIdx.x;
}
inline int ctaid_x_volatile() {
  return (int)blockIdx.x;
}

inline void named_bar_sync(u32 id, u32 count) {
  emu::named_bar(id, count, true);
}
inline void named_bar_arrive(u32 id, u32 count) {
  emu::named_bar(id, count, false);
}

template <int kRegs>
inline void setmaxnreg_inc() {}
template <int kRegs>
inline void setmaxnreg_dec() {}

// wgmma runs when issued (wgmma.cuh), so its fences and waits have nothing to order.
inline void wgmma_fence() {}
inline void wgmma_commit() {}
template <int kPending>
inline void wgmma_wait() {}
template <int kN, class T>
inline void pin_registers(T (&)[kN]) {}

// The descriptor's bits as on the GPU (emu_sm90.cpp decodes them).
inline u64 smem_desc(u32 addr, u32 lbo_bytes, u32 sbo_bytes, int swizzle_bytes = 128) {
  return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         ((u64)((sbo_bytes >> 4) & 0x3FFFu) << 32) | ((swizzle_bytes == 64 ? 2ull : 1ull) << 62);
}
inline u64 desc_advance(u64 desc, u32 bytes) {
  return desc + (u64)(bytes >> 4);
}

}  // namespace flashport::cuda::sm90
