// What the CDNA KV-cache update kernels (kvcache_append.hpp) and their host side share: the kernel
// parameters and the block shape. Plain C++ (the HIP backend includes it without a GPU compiler).
#pragma once

#include "core/problem.h"

namespace flashport::amd {

/// Kernel arguments: core/problem.h's KvAppendParams, shared with the CUDA append.
using KvAppendParams = flashport::KvAppendParams;

/// Waves per block of both kernels; grid x = ceil(rows / kKvWaves) with rows = batch * s_new * hk
/// (append) or batch * sq * hq (rotate_q).
inline constexpr int kKvWaves = 4;
inline constexpr int kKvThreads = kKvWaves * 64;  // CDNA waves are 64 lanes

}  // namespace flashport::amd
