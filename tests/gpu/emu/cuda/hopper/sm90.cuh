// Emulator stand-in for cuda/hopper/sm90.cuh: the thread-block cluster primitives the decode variant's
// cluster merge uses (FP_CLUSTER). A cluster's CTAs run together (emu_runtime.cpp's run_cluster), each with
// its own shared memory; a shared::cluster address is a CTA's shared offset tagged with (rank + 1) << 24.
#pragma once

#include "cuda/common/async_copy.cuh"

namespace flashport::emu {
unsigned cluster_rank();
unsigned cluster_size();
void sync_cluster();  // barrier.cluster arrive + wait: every live thread of every CTA of the cluster
float ld_cluster_f32(unsigned cluster_addr);
}  // namespace flashport::emu

namespace flashport::cuda::sm90 {

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

}  // namespace flashport::cuda::sm90
