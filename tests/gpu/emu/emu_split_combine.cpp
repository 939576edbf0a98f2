// The emulated split-KV combine kernel.
#include "cuda/split_combine.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(void* const* args) {
  split_combine(*static_cast<const flashport::cuda::FwdParams*>(args[0]));
}
const flashport::emu::Registrar reg("split_combine|", trampoline);
}  // namespace
