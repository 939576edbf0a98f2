// One emulated kernel variant (the Hopper kernels', the portable 16-bit backward's): build.sh compiles this
// file once per header that `list_variants ARCH headers DIR` wrote (force-included: the variant's defines,
// FP_EMU_SOURCE, FP_EMU_ENTRY renamed per variant, flashport::cuda renamed, FP_EMU_KEY) and registers the
// entry point under the spec's registry key.
#include <cstddef>
#include <utility>

#include FP_EMU_SOURCE
#include "emu_kernels.hpp"

namespace {

template <class... P, size_t... I>
void call_with(void (*kernel)(P...), void* const* args, std::index_sequence<I...>) {
  kernel(*static_cast<const P*>(args[I])...);
}
/// Calls `kernel` with the launch's arguments (a pointer per parameter, as cuLaunchKernelEx takes them).
template <class... P>
void call(void (*kernel)(P...), void* const* args) {
  call_with(kernel, args, std::index_sequence_for<P...>{});
}
void trampoline(void* const* args) {
  call(&FP_EMU_ENTRY, args);
}
const flashport::emu::Registrar reg(FP_EMU_KEY, trampoline);

}  // namespace
