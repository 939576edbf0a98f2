// The emulated kv-cache append and q rotation kernels.
#include "cuda/kvcache_append.cu"
#include "emu_kernels.hpp"

namespace {
void append(const void* p) {
  kv_append(*static_cast<const flashport::cuda::KvAppendParams*>(p));
}
void rotate(const void* p) {
  rotate_q(*static_cast<const flashport::cuda::KvAppendParams*>(p));
}
const flashport::emu::Registrar reg_append("kv_append|", append);
const flashport::emu::Registrar reg_rotate("rotate_q|", rotate);
}  // namespace
