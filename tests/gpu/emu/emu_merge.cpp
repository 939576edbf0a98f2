// The emulated merge_states kernel.
#include "cuda/merge_states.cu"
#include "emu_kernels.hpp"

namespace {
void trampoline(void* const* args) {
  ::merge_states(*static_cast<const flashport::MergeParams*>(args[0]));
}
const flashport::emu::Registrar reg("merge_states|", trampoline);
}  // namespace
