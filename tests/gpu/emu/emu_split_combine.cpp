// The emulated split-KV combine kernel.
#include "cuda/split_combine.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(const void* p) {
  split_combine(*static_cast<const flashport::cuda::FwdParams*>(p));
}
const flashport::emu::Registrar reg("split_combine|", trampoline);
}  // namespace
