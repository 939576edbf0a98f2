// The emulated merge_states kernel.
#include "cuda/merge_states.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(const void* p) {
  ::merge_states(*static_cast<const flashport::MergeParams*>(p));
}
const flashport::emu::Registrar reg("merge_states|", trampoline);
}  // namespace
