// The Hopper (sm_90a) primitives emu_sm90.cpp emulates, as the stand-ins for cuda/hopper/sm90.cuh and
// wgmma.cuh call them. Shared addresses are byte offsets into the CTA's emulated shared memory (a peer
// CTA's tagged with (rank + 1) << 24).
#pragma once

#include <cstddef>

namespace flashport::emu {
unsigned cluster_rank();
unsigned cluster_size();
void sync_cluster();  // barrier.cluster arrive + wait: every live thread of every CTA of the cluster
float ld_cluster_f32(unsigned cluster_addr);

void mbar_init(unsigned bar, unsigned count);
/// `count` arrivals, after adding `tx_bytes` to the phase's expected transaction bytes.
void mbar_arrive(unsigned bar, unsigned count, unsigned tx_bytes);
/// Whether the phase of parity `parity` has completed; the calling thread yields when it has not.
bool mbar_try_wait(unsigned bar, unsigned parity);
/// Until that phase has completed (the thread yields meanwhile).
void mbar_wait(unsigned bar, unsigned parity);
void tma_load_4d(unsigned dst, const void* desc, unsigned bar, int c0, int c1, int c2, int c3);
void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar);
void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes);
void st_async(unsigned dst, const float* v, int count, unsigned bar);
void named_bar(unsigned id, unsigned count, bool wait);
/// A spin-wait's failed poll: yields to the other threads (deadlock detection: no progress for rounds).
void spin(const char* what, unsigned addr);
/// Counts as progress for deadlock detection (a global counter moved on).
void progress();
unsigned char* shared_at(unsigned addr, unsigned bytes);  // bounds-checked; cluster tags resolved
/// Operand element types of wgmma.
enum class MmaType { kF16, kBF16, kE4M3 };
/// One warpgroup-wide wgmma.m64nNk16 (k32 for e4m3) as the calling thread sees it: its n / 2 accumulators
/// d, A from shared memory (desc_a, a_mn: MN-major) or, when `a_regs` is set, from the warp's A fragments
/// (four registers per thread), B from shared memory; scale_d 0 overwrites d.
void wgmma(MmaType type, int n, float* d, unsigned long long desc_a, bool a_mn, const unsigned* a_regs,
           unsigned long long desc_b, bool b_mn, unsigned scale_d);
}  // namespace flashport::emu
