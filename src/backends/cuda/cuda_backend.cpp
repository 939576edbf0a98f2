// The CUDA backend: what it supports, and dispatch to the forward, kv-cache, merge and backward launchers.
#include "backends/cuda/cuda_backend.hpp"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/cuda/backward.hpp"
#include "backends/cuda/forward.hpp"
#include "backends/cuda/hopper_fwd.hpp"
#include "flashport/tensor.hpp"
#include "jit/jit.hpp"

namespace flashport::cuda {
namespace {

std::string type_name(int t) {
  return dtype_name(static_cast<DType>(t));
}

/// FLASHPORT_CUDA_FORWARD=portable|hopper forces one forward kernel (tests, benchmarks); unset: automatic.
const char* forced_forward() {
  static const char* forced = std::getenv("FLASHPORT_CUDA_FORWARD");
  return forced ? forced : "";
}

/// The Hopper kernel (TMA, wgmma, warp specialisation) runs when the GPU is sm_90 and the call is one it
/// covers. It has no split-KV, so calls that cannot fill the GPU with 128-row query tiles (decode-like)
/// stay on the portable kernel, which splits the keys.
bool use_hopper(const AttnProblem& p) {
  const std::string forced = forced_forward();
  if (forced == "portable") return false;
  if (!hopper::unsupported(p, jit::device_arch(p.device)).empty()) return false;
  if (forced == "hopper") return true;
  const long long tiles = p.batch * p.hq * ((p.sq + 127) / 128);
  return tiles * 2 >= jit::device_sm_count(p.device);
}

class CudaBackend final : public core::Backend {
 public:
  const char* name() const override { return "cuda"; }

  std::string unsupported(const AttnProblem& p, Impl impl, bool backward) const override {
    if (impl == Impl::reference || impl == Impl::baseline)
      return "the reference and baseline implementations are CPU only";
    if (p.in_type == kE4M3 || p.in_type == kE4M3FNUZ || p.in_type == kE5M2)
      return "fp8 inputs are not supported on CUDA yet";
    if (p.in_type != kF16 && p.in_type != kBF16)
      return "inputs must be fp16 or bf16 on CUDA, got " + type_name(p.in_type);
    if (p.out_type != p.in_type)
      return "out must have the input dtype " + type_name(p.in_type) + ", got " + type_name(p.out_type);
    if (p.s_dmask) return "s_dmask (attention probabilities) is produced by the CPU reference only";
    if (p.d % 8 != 0 || p.dv % 8 != 0)
      return "head dim must be a multiple of 8 on CUDA, got d = " + std::to_string(p.d) +
             ", dv = " + std::to_string(p.dv);
    if (p.d > 256 || p.dv > 256)
      return "head dim must be <= 256 on CUDA, got d = " + std::to_string(p.d) +
             ", dv = " + std::to_string(p.dv);
    if (p.hq > 65535) return "at most 65535 query heads on CUDA, got " + std::to_string(p.hq);
    if (p.sq > INT32_MAX || p.sk > INT32_MAX)
      return "sequence lengths must be below 2^31 on CUDA, got " + std::to_string(p.sq) + " x " +
             std::to_string(p.sk);
    if (backward && p.block_table) return "backward through paged K/V is not supported on CUDA";
    if (backward && (p.kv_batch_idx || p.leftpad_k)) return "backward through a KV cache is not supported";
    // The one driver query of a call: the memory really is on the device the tensors claim.
    const int device = jit::pointer_device(p.q.ptr);
    if (device < 0) return "q is not a CUDA device pointer";
    if (device != p.device)
      return "q's memory is on cuda:" + std::to_string(device) +
             ", but the tensors say cuda:" + std::to_string(p.device);
    const int arch = jit::device_arch(device);
    if (arch < 80)
      return "needs compute capability 8.0 or newer, device " + std::to_string(device) + " is " +
             std::to_string(arch / 10) + "." + std::to_string(arch % 10);
    return {};
  }

  void forward(const AttnProblem& p, Impl) const override {
    if (use_hopper(p))
      hopper::forward(p);
    else
      launch_forward(p);
  }
  void backward(const AttnProblem& p, Impl) const override { launch_backward(p); }
  void forward_kvcache(const core::KvCacheProblem& kp, Impl) const override { launch_forward_kvcache(kp); }
  void merge_states(const core::MergeProblem& mp) const override { launch_merge_states(mp); }
  void copy_to_host(void* dst, const void* src, size_t bytes, void* stream) const override {
    jit::copy_to_host(dst, src, bytes, stream);
  }
};

}  // namespace

const core::Backend* backend() {
  static const CudaBackend instance;
  static const bool usable = jit::driver_available();
  return usable ? &instance : nullptr;
}

}  // namespace flashport::cuda
