// The emulated kv-cache append and q rotation kernels.
#include "cuda/kvcache_append.cu"
#include "emu_kernels.hpp"

namespace {
void append(void* const* args) {
  kv_append(*static_cast<const flashport::cuda::KvAppendParams*>(args[0]));
}
void rotate(void* const* args) {
  rotate_q(*static_cast<const flashport::cuda::KvAppendParams*>(args[0]));
}
const flashport::emu::Registrar reg_append("kv_append|", append);
const flashport::emu::Registrar reg_rotate("rotate_q|", rotate);
}  // namespace
