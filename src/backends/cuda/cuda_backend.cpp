// The CUDA backend: what it supports, and dispatch: forward and backward through their family tables
// (family.hpp), kv-cache and merge to the portable launchers.
#include "backends/cuda/cuda_backend.hpp"

#include <cstdint>
#include <string>

#include "backends/cuda/arch.hpp"
#include "backends/cuda/backward.hpp"
#include "backends/cuda/family.hpp"
#include "backends/cuda/index_check.hpp"
#include "backends/cuda/sm80/forward.hpp"
#include "backends/cuda/variants.hpp"
#include "core/tuning.hpp"
#include "flashport/error.hpp"
#include "flashport/tensor.hpp"
#include "jit/jit.hpp"

namespace flashport::cuda {
namespace {

/// The forward family `p` takes on `arch` (FLASHPORT_CUDA_FORWARD may force one): a plain forward's, and
/// the attention of a kv-cache call's.
const ForwardFamily& forward_family(const AttnProblem& p, int arch) {
  return choose(forward_families(), p, arch, core::tuning().cuda_forward.get());
}

class CudaBackend final : public core::Backend {
 public:
  const char* name() const override { return "cuda"; }

  std::string unsupported(const AttnProblem& p, Impl impl, bool backward) const override {
    if (impl == Impl::reference || impl == Impl::baseline)
      return "the reference and baseline implementations are CPU only";
    // fp8 (e4m3fn, e4m3fnuz, e5m2): the forward through the portable kernel's fp8 variant (every format
    // decoded exactly to bf16 while loading tiles) or, for e4m3 where it applies, the Hopper fp8 kernel;
    // the backward as the output dtype's backward of the dequantised inputs (launch_backward).
    // fp32: forward and backward on the portable family's fp32 kernels (CUDA cores; attn_fwd_f32.cu,
    // attn_bwd_f32.cu).
    if (p.in_type == kF32) {
      if (p.out_type != kF32) return "out must have the input dtype float32 on CUDA";
    } else if (std::string why = core::gpu_dtype_unsupported(p, backward && !is_fp8_elem(p.in_type), "CUDA");
               !why.empty()) {
      return why;
    }
    const bool fp8 = is_fp8_elem(p.in_type);
    if (fp8 && p.dropout_p > 0.0f)
      return "dropout with fp8 inputs is not supported on CUDA (the fp8 variant has no dropout)";
    if (p.s_dmask) return "s_dmask (attention probabilities) is produced by the CPU reference only";
    if (p.d % 8 != 0 || p.dv % 8 != 0)
      return "head dim must be a multiple of 8 on CUDA, got d = " + std::to_string(p.d) +
             ", dv = " + std::to_string(p.dv);
    if (p.d > 256 || p.dv > 256)
      return "head dim must be <= 256 on CUDA, got d = " + std::to_string(p.d) +
             ", dv = " + std::to_string(p.dv);
    if (p.sq > INT32_MAX || p.sk > INT32_MAX)
      return "sequence lengths must be below 2^31 on CUDA, got " + std::to_string(p.sq) + " x " +
             std::to_string(p.sk);
    if (backward && p.block_table) return "backward through paged K/V is not supported on CUDA";
    if (backward && (p.kv_batch_idx || p.leftpad_k)) return "backward through a KV cache is not supported";
    // The one driver query of a call: the memory really is on the device the tensors claim. An empty
    // q (no queries: torch gives it a null pointer) has no memory to ask about.
    const int device = p.q.ptr ? jit::pointer_device(p.q.ptr) : p.device;
    if (device < 0) return "q is not a CUDA device pointer";
    if (device != p.device)
      return "q's memory is on cuda:" + std::to_string(device) +
             ", but the tensors say cuda:" + std::to_string(p.device);
    if (device >= jit::device_count())
      return "device cuda:" + std::to_string(device) + " is not visible (" +
             std::to_string(jit::device_count()) + " GPUs)";
    const int arch = jit::device_arch(device);
    if (arch < 80)
      return "needs compute capability 8.0 or newer, device " + std::to_string(device) + " is " +
             std::to_string(arch / 10) + "." + std::to_string(arch % 10);
    if (p.hq > limits(arch).max_grid_yz)
      return "at most " + std::to_string(limits(arch).max_grid_yz) + " query heads on CUDA, got " +
             std::to_string(p.hq);
    return {};
  }

  // Each call first reports what the device found wrong with an earlier call's index tensors, then
  // queues the check of its own ahead of its kernels (index_check.hpp).
  void forward(const AttnProblem& p, Impl) const override {
    raise_device_fault(p.device);
    const int arch = jit::device_arch(p.device);
    const ForwardFamily& family = forward_family(p, arch);
    check_indices_async(p, kCallForward);
    family.launch(p, arch);
  }
  void backward(const AttnProblem& p, Impl) const override {
    raise_device_fault(p.device);
    check_indices_async(p, kCallBackward);
    launch_backward(p);
  }
  void forward_kvcache(const core::KvCacheProblem& kp, Impl) const override {
    core::refuse_fp8_cache_update(kp, "cuda", "CUDA");
    raise_device_fault(kp.attn.device);
    const int arch = jit::device_arch(kp.attn.device);
    // The attention over the updated cache takes the kernel family a plain forward would (a prefill chunk
    // against a paged or dense cache runs the Hopper kernel where it applies; decode-sized calls, which it
    // declines, the portable split-KV kernel), unless num_splits > 1 asks for the split-KV kernel. The
    // index check goes with that launch: the portable launcher runs it inside its decode kernel where it
    // can (one launch fewer per decode step), every other launch queues index_check.cu first.
    bool checked = false;
    launch_forward_kvcache(kp, [&](const AttnProblem& a) {
      checked = true;
      const ForwardFamily& family = forward_family(a, arch);
      if (kp.num_splits > 1 || is_fallback(forward_families(), family))
        return launch_forward(a, kp.num_splits, kCallKvCache);
      check_indices_async(a, kCallKvCache);
      family.launch(a, arch);
    });
    if (!checked) check_indices_async(kp.attn, kCallKvCache);  // no query row: nothing attended
  }
  void merge_states(const core::MergeProblem& mp) const override {
    if (mp.out.ptr) raise_device_fault(jit::pointer_device(mp.out.ptr));
    launch_merge_states(mp);
  }
  void check_device(int device) const override { synchronize_and_raise(device); }
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
