// Hopper (sm_90a) primitives as inline PTX: mbarriers, TMA tensor loads, proxy fences, named barriers,
// register reallocation, wgmma fences and shared-memory matrix descriptors. NVRTC-safe.
#pragma once

#include "cuda/common/types.cuh"
#include "cuda/hopper/sm90_config.h"

namespace flashport::cuda::sm90 {

// ---------------------------------------------------------------------------------------------
// mbarrier (shared::cta, 64-bit). Phase parity: a fresh barrier is in phase 0; try_wait.parity(P)
// succeeds once the phase with parity P has completed, so waiting on parity 1 of a fresh barrier
// returns at once (the producer's first pass over the empty barriers relies on this).

/// Initialises the barrier at shared address `bar` to expect `count` arrivals per phase.
FP_DEV void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/// Makes initialised barriers visible to the async proxy (TMA) and other threads; a CTA barrier
/// must follow before anyone uses them.
FP_DEV void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/// Arrives once and adds `bytes` to the transaction count the current phase waits for.
FP_DEV void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

/// Arrives once (release semantics: this thread's prior shared-memory reads are ordered before).
FP_DEV void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

/// `count` arrivals at once (one thread standing for `count` threads whose work it completed).
FP_DEV void mbar_arrive_count(u32 bar, u32 count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

/// An arrival on `bar` once every cp.async this thread issued so far has landed (.noinc: the arrival is one
/// of the count the barrier was initialised with); the thread goes on at once.
FP_DEV void mbar_arrive_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

/// True once the phase of parity `parity` has completed (the hardware may suspend briefly). kCluster:
/// acquire at cluster scope, for barriers that peer CTAs arrive on or complete bytes of.
template <bool kCluster = false>
FP_DEV bool mbar_try_wait(u32 bar, u32 parity) {
  u32 done;
  if constexpr (kCluster) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } else {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
  return done != 0;
}

/// Blocks until the phase of parity `parity` has completed (acquire: the data it guards is visible).
FP_DEV void mbar_wait(u32 bar, u32 parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// ---------------------------------------------------------------------------------------------
// TMA (cp.async.bulk.tensor): one elected thread issues; completion is counted in bytes on `bar`.

/// Loads the box at coordinates (c0 innermost .. c3) of the 4-D tensor map `desc` (a
/// __grid_constant__ kernel parameter) into shared address `dst`, completing on mbarrier `bar`.
/// Out-of-bounds elements are zero-filled and still counted in the transaction bytes.
FP_DEV void tma_load_4d(u32 dst, const hopper::TmaDesc& desc, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, "
      "%6}], [%2];" ::"r"(dst),
      "l"(reinterpret_cast<u64>(&desc)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

/// Loads one 64-column chunk box at (column, head, row, batch) of a (d, ...) operand map, placing the three
/// outer coordinates in the tensor-map dimensions the host chose (backends/cuda/tma_map.hpp).
FP_DEV void tma_load_chunk(u32 dst, const hopper::TmaDesc& desc, const hopper::TmaDims& dims, u32 bar,
                           int column, int head, int row, int batch) {
  const hopper::TmaOuter c = hopper::outer_coords(dims, head, row, batch);
  tma_load_4d(dst, desc, bar, column, c.c1, c.c2, c.c3);
}

/// Fetches the tensor map into the TMA unit's descriptor cache ahead of the first load.
FP_DEV void tma_prefetch_desc(const hopper::TmaDesc& desc) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(&desc)) : "memory");
}

/// Orders this thread's generic-proxy shared-memory writes before later async-proxy accesses
/// (wgmma operand reads, TMA); each writing thread issues it before the barrier that publishes.
FP_DEV void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/// Orders global-memory accesses across the proxies: this thread's earlier generic accesses (an acquire
/// load) before its later bulk operations, and its completed bulk writes before its later generic ones.
FP_DEV void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

/// Bulk asynchronous copy (no tensor map; one thread issues): `bytes` (a multiple of 16) from global
/// `g_src` to shared `s_dst`, both 16-byte aligned, completing `bytes` of mbarrier `bar`'s transaction.
FP_DEV void bulk_load(u32 s_dst, const void* g_src, u32 bytes, u32 bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(s_dst),
      "l"(g_src), "r"(bytes), "r"(bar)
      : "memory");
}

/// Bulk asynchronous reduce-add (one thread issues): `bytes` (a multiple of 16) of fp32 at shared `s_src`
/// added element-wise to global `g_dst` (16-byte aligned) in L2, tracked by the issuing thread's bulk
/// groups. The shared source must have been published to the async proxy (fence_proxy_async by its
/// writers, then a barrier).
FP_DEV void bulk_reduce_add_f32(float* g_dst, u32 s_src, u32 bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;" ::"l"(g_dst),
               "r"(s_src), "r"(bytes)
               : "memory");
}
FP_DEV void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
/// Waits until at most kPending of this thread's bulk groups still read their shared source.
template <int kPending>
FP_DEV void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
/// Waits until at most kPending of this thread's bulk groups are incomplete (their global writes not yet
/// performed).
template <int kPending>
FP_DEV void bulk_wait_complete() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}
/// Waits until every bulk group of this thread has completed (its global writes performed).
FP_DEV void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// ---------------------------------------------------------------------------------------------
// Thread-block clusters and distributed shared memory. An address of the peer CTA's shared memory
// (`peer_addr`) is only valid while that CTA runs: every remote write or arrival must be one the peer
// waits for before it exits.

/// This CTA's rank in its cluster, and the cluster's CTA count (1 without a cluster launch).
FP_DEV u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
FP_DEV u32 cluster_size() {
  u32 n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return n;
}

/// Every thread of every CTA of the cluster: barriers initialised before are then visible to the peers.
FP_DEV void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

/// The shared::cluster address of this CTA's shared address `s_addr` in the CTA of rank `rank`.
FP_DEV u32 peer_addr(u32 s_addr, u32 rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(s_addr), "r"(rank));
  return r;
}

/// A float of a cluster CTA's shared memory (shared::cluster address from peer_addr).
FP_DEV float ld_cluster_f32(u32 cluster_addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_addr) : "memory");
  return v;
}

/// Arrives once on a peer CTA's mbarrier (release at cluster scope: this thread's earlier accesses,
/// including completed wgmma reads of shared memory, are ordered before).
FP_DEV void mbar_arrive_peer(u32 cluster_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}

/// mbar_wait for barriers that peer CTAs arrive on or complete bytes of (acquire at cluster scope).
FP_DEV void mbar_wait_cluster(u32 bar, u32 parity) {
  while (!mbar_try_wait<true>(bar, parity)) {
  }
}

/// 8 bytes into a peer CTA's shared memory (shared::cluster address `dst`, 8-byte aligned), completing 8
/// transaction bytes on the peer's mbarrier `cluster_bar`; the thread goes on at once.
FP_DEV void st_async_8(u32 dst, float a, float b, u32 cluster_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];" ::"r"(dst), "f"(a),
      "f"(b), "r"(cluster_bar)
      : "memory");
}

/// 16 bytes into a peer CTA's shared memory (shared::cluster address `dst`, 16-byte aligned),
/// completing 16 transaction bytes on the peer's mbarrier `cluster_bar`; the thread goes on at once.
FP_DEV void st_async_16(u32 dst, float a, float b, float c, float d, u32 cluster_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
      "f"(a), "f"(b), "f"(c), "f"(d), "r"(cluster_bar)
      : "memory");
}

// ---------------------------------------------------------------------------------------------
// Named barriers (ids 1..15; 0 is __syncthreads). `count` = threads taking part, a multiple of 32.

FP_DEV void named_bar_sync(u32 id, u32 count) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
FP_DEV void named_bar_arrive(u32 id, u32 count) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

// ---------------------------------------------------------------------------------------------
// Plain shared and global accesses in PTX (shared addresses from smem_addr), where the kernels need an
// access the compiler may neither merge, split nor move, or an ordering the C++ form does not give.

FP_DEV void st_shared_u32(u32 s_addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(s_addr), "r"(v) : "memory");
}
FP_DEV void st_shared_f32x2(u32 s_addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(s_addr), "f"(x), "f"(y) : "memory");
}
/// Four floats to a 16-byte aligned shared address.
FP_DEV void st_shared_f32x4(u32 s_addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(s_addr), "f"(a), "f"(b), "f"(c), "f"(d)
               : "memory");
}
/// Two floats at an 8-byte aligned shared address.
FP_DEV Float2 ld_shared_f32x2(u32 s_addr) {
  Float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(s_addr) : "memory");
  return v;
}
/// Four floats at a 16-byte aligned shared address.
FP_DEV void ld_shared_f32x4(u32 s_addr, float (&v)[4]) {
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "r"(s_addr)
               : "memory");
}
/// A shared int read at every use (ld.volatile), never kept in a register across the caller's loop.
FP_DEV int ld_volatile_shared_s32(u32 s_addr) {
  int v;
  asm volatile("ld.volatile.shared.u32 %0, [%1];" : "=r"(v) : "r"(s_addr));
  return v;
}

/// Adds v to g[0..1] when `pred` (predicated inside the asm: no branch around it).
FP_DEV void red_add_f32x2_if(bool pred, float* g, Float2 v) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n@p red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::
          "l"(g),
      "f"(v.x), "f"(v.y), "r"((int)pred)
      : "memory");
}
/// A global int read with acquire semantics at GPU scope.
FP_DEV int ld_acquire_gpu_s32(const int* g) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(g) : "memory");
  return v;
}
/// Adds 1 to a global int with release semantics at GPU scope.
FP_DEV void red_release_gpu_inc(int* g) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(g) : "memory");
}

/// threadIdx.x / blockIdx.x read by a volatile asm, so a value derived from them is computed where it is
/// read (not once, ahead of a loop, and kept live across it).
FP_DEV int tid_x_volatile() {
  u32 tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return (int)tid;
}
FP_DEV int ctaid_x_volatile() {
  u32 x;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(x));
  return (int)x;
}

// ---------------------------------------------------------------------------------------------
// Register reallocation between warpgroups (all threads of a warpgroup execute the same one).

template <int kRegs>
FP_DEV void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
FP_DEV void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---------------------------------------------------------------------------------------------
// wgmma bookkeeping. A batch is: wgmma_fence, mma_async..., wgmma_commit; wgmma_wait<N> returns
// when at most N committed batches of this warpgroup are still running.

/// Orders earlier register writes (accumulators, register A operands) before the next wgmma.
FP_DEV void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
FP_DEV void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
template <int kPending>
FP_DEV void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

/// Pins registers in place: the compiler may not move their reads or writes across this point.
/// Placed after wgmma_wait on accumulators (their values are only final there) and on register A
/// operands (they must stay untouched until the wgmma that reads them has completed).
template <int kN>
FP_DEV void pin_registers(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
FP_DEV void pin_registers(u32 (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// ---------------------------------------------------------------------------------------------
// Shared-memory matrix descriptors (PTX ISA "Matrix Descriptor Format"), 128-byte swizzle only:
//   bits  0-13  start address >> 4       bits 16-29  leading-dimension byte offset >> 4
//   bits 32-45  stride-dimension byte offset >> 4
//   bits 49-51  base offset (0: every swizzle atom starts 1024-byte aligned)
//   bits 62-63  swizzle mode (1 = 128B)
// The 128B swizzle atom is 8 rows x 128 bytes (1024 B); the 16-byte unit u of row r is stored at
// unit u ^ (r % 8), exactly what TMA's CU_TENSOR_MAP_SWIZZLE_128B writes into a 1024-aligned box.
//   K-major (Q, K; rows of 64 elements along K): SBO = 1024 (next 8 rows); LBO unused (set to 16);
//     the k-th 16-element step inside a 64-wide chunk starts 32 * k bytes further (the hardware
//     applies the XOR on the final address bits, so the offset composes with the swizzle).
//   MN-major (V as the B operand of P V; rows = keys, 64 columns along N): LBO = byte distance
//     between 64-column chunks along N, SBO = 1024 (next 8 keys); step k of 16 keys = 2048 bytes.

/// Descriptor of the 128B-swizzled operand at shared address `addr` (1024-aligned atom + k offset), or
/// with `swizzle_bytes` 64 of a 64B-swizzled one (atoms of 8 rows x 64 bytes, 512-aligned; mode 2: the FP8
/// forward's 64-byte Q and K rows at d 64; TMA's CU_TENSOR_MAP_SWIZZLE_64B writes that layout).
FP_DEV u64 smem_desc(u32 addr, u32 lbo_bytes, u32 sbo_bytes, int swizzle_bytes = 128) {
  return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)((lbo_bytes >> 4) & 0x3FFFu) << 16) |
         ((u64)((sbo_bytes >> 4) & 0x3FFFu) << 32) | ((swizzle_bytes == 64 ? 2ull : 1ull) << 62);
}

/// A descriptor advanced by `bytes` (a multiple of 16; the 14-bit address field cannot carry out
/// because shared addresses stay below 256 KB).
FP_DEV u64 desc_advance(u64 desc, u32 bytes) {
  return desc + (u64)(bytes >> 4);
}

}  // namespace flashport::cuda::sm90
