// Programmatic dependent launch (sm_90+). A launch with jit::LaunchOrder::overlap_prior lets a kernel start
// while the kernel queued before it on the stream is still running (its launch, block scheduling and
// prologue overlap that kernel's tail; a decode call's index check -> attention -> split combine no longer
// pay a full launch gap each). The price is this contract, kept by every entry point however the launcher
// orders it: wait_prior_grids() comes before the first global-memory access (a predecessor may still be
// writing what this kernel reads, or reading what it writes), and release_dependent_grids() after it, so
// a dependent starts only once everything queued before this grid has finished. JitVariants checks that
// every sm_90 variant has both instructions. Below sm_90 both are empty: no launch there overlaps.
#pragma once

#include "cuda/common/types.cuh"

namespace flashport::cuda {

/// Blocks until every grid this one depends on has completed and its writes are visible.
FP_DEV void wait_prior_grids() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// Lets the next grid on the stream launch now (it still waits for this grid to finish before it touches
/// memory: wait_prior_grids).
FP_DEV void release_dependent_grids() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The two in the contract's order: the first statement of every kernel.
FP_DEV void order_after_prior_grids() {
  wait_prior_grids();
  release_dependent_grids();
}

}  // namespace flashport::cuda
