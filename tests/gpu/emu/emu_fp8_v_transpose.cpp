// The emulated V^T pass of the Hopper fp8 forward (the forward itself is not emulated: TMA and wgmma).
#include "cuda/hopper/fp8_v_transpose.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(void* const* args) {
  ::flashport_fp8_v_transpose(*static_cast<const flashport::cuda::hopper::Fp8VtParams*>(args[0]));
}
const flashport::emu::Registrar reg("flashport_fp8_v_transpose|", trampoline);
}  // namespace
