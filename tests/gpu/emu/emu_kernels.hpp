// The emulator's kernel table: each emulated kernel translation unit registers its entry point
// under the jit::KernelSpec (entry + defines) that would select it on a GPU.
#pragma once

#include <string>

#include "emu_cuda.hpp"
#include "jit/jit.hpp"

namespace flashport::emu {

/// Calls the kernel with its parameters (the launch's argument array: a pointer per parameter).
using KernelFn = void (*)(void* const* args);
struct KernelLaunch {
  KernelFn fn;
  void* const* args;
};

/// "entry|K=V,K=V" in KernelSpec define order.
std::string kernel_name(const jit::KernelSpec& spec);
/// The registered kernel for `spec`, or null.
KernelFn find_kernel(const jit::KernelSpec& spec);

struct Registrar {
  Registrar(const char* name, KernelFn fn);
};

/// Runs `launch` over `grid` blocks of `threads` fibers each, in clusters of `cluster_x` CTAs along x
/// (1: none), whose CTAs run together.
void launch_grid(const KernelLaunch& launch, Dim3 grid, unsigned threads, size_t dynamic_smem,
                 unsigned cluster_x = 1);
/// How many launches so far used thread-block clusters (tests check which path a call took).
long long cluster_launches();

}  // namespace flashport::emu

#define FP_EMU_STR2(x) #x
#define FP_EMU_STR(x) FP_EMU_STR2(x)
