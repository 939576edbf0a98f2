// The emulated fp8_scale kernel (the fp8 backward's dequantise and descale passes).
#include "cuda/fp8_scale.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(void* const* args) {
  ::fp8_scale(*static_cast<const flashport::cuda::Fp8ScaleParams*>(args[0]));
}
const flashport::emu::Registrar reg("fp8_scale|", trampoline);
}  // namespace
