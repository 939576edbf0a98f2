// FP8 forward runs on device copies of fp8check's inputs (tests/hip/hip_fp8_inputs.hpp), shared by the
// portable (test_fwd_fp8.cpp) and Hopper (test_hopper_fwd_fp8.cpp) fp8 suites.
#pragma once

#include <functional>

#include "gpu/gpu_test_util.hpp"
#include "hip/hip_fp8_inputs.hpp"

namespace flashport::test::gpu {

/// A host tensor's bytes on the device, `shift` bytes past an aligned allocation (a shift that is not
/// a multiple of 16 makes the kernel take its byte loads instead of 8-byte ones); empty tensors (absent
/// options) stay as they are.
struct DeviceCopies {
  std::vector<DevicePtr> keep;
  HostTensor shell(const HostTensor& h, size_t shift = 0) {
    if (h.tv.data == nullptr || h.bytes.empty()) return h;
    keep.emplace_back(device_alloc(h.bytes.size() + shift));
    char* p = static_cast<char*>(keep.back().get()) + shift;
    copy_bytes(p, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice);
    HostTensor s;  // no bytes of its own: its view is the device copy
    s.tv = h.tv;
    s.tv.data = p + (static_cast<const char*>(h.tv.data) - (const char*)h.bytes.data());
    s.tv.device = cpu_mode() ? Device{} : Device{DeviceType::cuda, 0};
    return s;
  }
};

struct Fp8Result {
  fastcheck::Forward f;
  int64_t out_nan = 0, lse_nan = 0;
};

/// Out (dtype `out`) and LSE of the fp8 case `c` through flashport::forward on cuda:0; `misalign`: q, k
/// and v start 1, 3 and 8 bytes past 16-byte boundaries (the kernel's unaligned, byte-load path). `run`
/// replaces flashport::forward (a kernel family called directly).
inline Fp8Result run_cuda_fp8(const Case& c, const fp8check::Inputs& in, DType out, bool misalign = false,
                              const std::function<void(const ForwardArgs&)>& run = nullptr) {
  DeviceCopies dev;
  fastcheck::Inputs d;
  d.q = dev.shell(in.fp8.q, misalign ? 1 : 0);
  d.k = dev.shell(in.fp8.k, misalign ? 3 : 0);
  d.v = dev.shell(in.fp8.v, misalign ? 8 : 0);
  d.alibi = dev.shell(in.fp8.alibi), d.cu_q = dev.shell(in.fp8.cu_q), d.cu_k = dev.shell(in.fp8.cu_k);
  d.used_k = dev.shell(in.fp8.used_k), d.block_table = dev.shell(in.fp8.block_table);
  HostTensor descale[3];
  for (int w = 0; w < 3; ++w) descale[w] = dev.shell(in.descale[w]);
  const fastcheck::Forward host = fp8check::outputs(c, out);  // NaN-poisoned out and LSE
  DeviceTensor d_out = DeviceTensor::from(host.out), d_lse = DeviceTensor::from(host.lse);
  fastcheck::Forward f;
  f.out.tv = d_out.view(), f.lse.tv = d_lse.view();
  const ForwardArgs a = fp8check::args(c, d, descale, f, Impl::automatic);
  if (run) {
    run(a);
  } else {
    forward(a);
  }
  Fp8Result r{{d_out.to_host(host.out), d_lse.to_host(host.lse)}};
  r.out_nan = count_nan(r.f.out), r.lse_nan = count_nan(r.f.lse);
  return r;
}

}  // namespace flashport::test::gpu
