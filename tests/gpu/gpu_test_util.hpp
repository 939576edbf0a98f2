// GPU test helpers: device copies of host tensors, poisoned device outputs, attention cases with
// fresh inputs, and runners that compare the CUDA backend against the CPU oracle (SPEC accuracy rule).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common/cases.hpp"
#include "common/device_fault.hpp"

namespace flashport::test::gpu {

/// FLASHPORT_GPU_TESTS_ON_CPU=1 runs this suite with "device" tensors in host memory on the CPU
/// backend: a dry run of the harness itself (shapes, validation, poison checks) without a GPU.
inline bool cpu_mode() {
  static const bool on = [] {
    const char* v = std::getenv("FLASHPORT_GPU_TESTS_ON_CPU");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

/// Built into the kernel emulator (tests/gpu/emu): "device" memory is host memory tagged cuda:0, and
/// the CUDA backend runs the emulated kernels.
#ifdef FLASHPORT_GPU_EMU
inline constexpr bool kEmulated = true;
#else
inline constexpr bool kEmulated = false;
#endif

/// Device tensors live in host memory (cpu_mode() or the emulator).
inline bool host_memory() {
  return cpu_mode() || kEmulated;
}

/// True when a CUDA device is visible and flashport built its CUDA backend (or in cpu_mode()).
inline bool have_gpu() {
  static const bool ok = [] {
    if (host_memory()) return true;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
    return std::string(available_backends()).find("cuda") != std::string::npos;
  }();
  return ok;
}

#define FP_SKIP_WITHOUT_GPU() \
  if (!::flashport::test::gpu::have_gpu()) GTEST_SKIP() << "no CUDA GPU / CUDA backend"

/// An sm_90 device with the CUDA backend (the Hopper kernels), or cpu_mode() (host "device" tensors, the
/// support checks still run and the CPU reference stands in for the kernels: a dry run of the harness), or
/// the emulator as an sm_90 (FLASHPORT_EMU_ARCH unset or 90; it emulates the Hopper kernels too).
inline bool have_sm90() {
  static const bool ok = [] {
    if (cpu_mode()) return true;
    if (kEmulated) {
      const char* arch = std::getenv("FLASHPORT_EMU_ARCH");
      return arch == nullptr || std::string(arch) == "90";
    }
    if (!have_gpu()) return false;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
    return prop.major == 9 && prop.minor == 0;
  }();
  return ok;
}

#define FP_SKIP_WITHOUT_SM90() \
  if (!::flashport::test::gpu::have_sm90()) GTEST_SKIP() << "needs an sm_90 (Hopper) GPU"

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Device memory owned by a unique_ptr (freed with cudaFree; host memory in cpu_mode()).
struct CudaFree {
  void operator()(void* p) const {
    if (host_memory())
      std::free(p);
    else
      cudaFree(p);
  }
};

inline void* device_alloc(size_t bytes) {
  void* p = nullptr;
  if (host_memory()) return std::malloc(std::max<size_t>(bytes, 1));
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
inline void copy_bytes(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (host_memory()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  check_cuda(cudaMemcpy(dst, src, bytes, kind), "cudaMemcpy");
}
inline void fill_bytes(void* dst, int value, size_t bytes) {
  if (host_memory()) {
    std::memset(dst, value, bytes);
    return;
  }
  check_cuda(cudaMemset(dst, value, bytes), "cudaMemset");
}
using DevicePtr = std::unique_ptr<void, CudaFree>;

/// A device copy of a host tensor: same dtype, shape and strides on cuda:0.
struct DeviceTensor {
  DevicePtr mem;
  size_t bytes = 0;
  TensorView tv;

  /// Copies `h` (its whole byte buffer, so strided views of it keep their meaning).
  static DeviceTensor from(const HostTensor& h) { return from_view(h, h.tv); }
  /// Copies the byte buffer of `h` and describes it with `view` (whose data points into h's bytes).
  static DeviceTensor from_view(const HostTensor& h, const TensorView& view) {
    DeviceTensor d;
    d.bytes = h.bytes.size();
    void* p = device_alloc(d.bytes);
    d.mem.reset(p);
    copy_bytes(p, h.bytes.data(), d.bytes, cudaMemcpyHostToDevice);
    d.tv = view;
    d.tv.data = static_cast<char*>(p) + (static_cast<const char*>(view.data) - (const char*)h.bytes.data());
    d.tv.device = cpu_mode() ? Device{} : Device{DeviceType::cuda, 0};
    return d;
  }
  /// A device tensor filled with 0xFF bytes: NaN in f16, bf16 and f32, so unwritten elements show.
  static DeviceTensor poisoned(const HostTensor& like) {
    DeviceTensor d = from(like);
    fill_bytes(d.mem.get(), 0xFF, d.bytes);
    return d;
  }
  /// The device bytes copied back into a host tensor laid out like `like`.
  HostTensor to_host(const HostTensor& like) const {
    HostTensor h = like;
    if (!host_memory()) check_cuda(cudaDeviceSynchronize(), "kernel execution");
    copy_bytes(h.bytes.data(), mem.get(), bytes, cudaMemcpyDeviceToHost);
    return h;
  }
  TensorView view() const { return tv; }
};

/// Number of NaN elements (unwritten after poisoning).
inline int64_t count_nan(const HostTensor& t) {
  int64_t n = 0;
  for (int64_t i = 0; i < t.numel(); ++i) n += std::isnan(t.get(i)) ? 1 : 0;
  return n;
}

// The problem description (Case, Layout, dense, with, Features) and the shared shape tables:
// common/cases.hpp.

/// An operand (rows, heads, channels) stored with `pad` spare channels per row: the returned host
/// tensor owns the padded buffer, `view` describes the unpadded operand.
struct HostOperand {
  HostTensor storage;
  TensorView view;
};
inline HostOperand make_operand(DType dt, std::vector<int64_t> shape, int64_t pad, double stddev,
                                bool poison_it) {
  std::vector<int64_t> padded = shape;
  padded.back() += pad;
  HostOperand o{randn(dt, padded, stddev), {}};
  if (poison_it) poison(o.storage);
  o.view = o.storage.tv;
  o.view.shape[o.view.ndim - 1] = shape.back();
  return o;
}

/// Contiguous copy of a (possibly strided) view into `storage`.
inline HostTensor gather(const HostOperand& o) {
  const TensorView& v = o.view;
  HostTensor out(v.dtype, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim));
  const int64_t n = out.numel();
  const auto* base = static_cast<const unsigned char*>(o.storage.tv.data);
  const int64_t off0 = (static_cast<const unsigned char*>(v.data) - base) / dtype_size(v.dtype);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i, off = off0;
    for (int dim = v.ndim - 1; dim >= 0; --dim) {
      off += (rem % v.shape[dim]) * v.stride[dim];
      rem /= v.shape[dim];
    }
    out.set(i, o.storage.get(off));
  }
  return out;
}

/// Host inputs of a forward case.
struct FwdInputs {
  HostOperand q, k, v;
  HostTensor alibi, cu_q, cu_k, used_k, block_table;
};

inline FwdInputs make_inputs(const Case& c) {
  FwdInputs in;
  const int64_t b = c.batch();
  switch (c.layout) {
    case Layout::dense:
      in.q = make_operand(c.dtype, {b, c.q_lens[0], c.hq, c.d}, c.pad, c.q_stddev, false);
      in.k = make_operand(c.dtype, {b, c.k_lens[0], c.hk, c.d}, c.pad, 1.0, false);
      in.v = make_operand(c.dtype, {b, c.k_lens[0], c.hk, c.dv}, c.pad, 1.0, false);
      break;
    case Layout::varlen:
      in.q = make_operand(c.dtype, {c.total_q(), c.hq, c.d}, 0, c.q_stddev, false);
      in.k = make_operand(c.dtype, {c.total_k(), c.hk, c.d}, 0, 1.0, false);
      in.v = make_operand(c.dtype, {c.total_k(), c.hk, c.dv}, 0, 1.0, false);
      in.cu_q = cumsum_i32(c.q_lens);
      in.cu_k = cumsum_i32(c.k_lens);
      break;
    case Layout::paged: {
      const int64_t blocks = page_pool_blocks(c);
      in.q = make_operand(c.dtype, {b, c.q_lens[0], c.hq, c.d}, 0, c.q_stddev, false);
      in.k = make_operand(c.dtype, {blocks, c.page, c.hk, c.d}, 0, 1.0, false);
      in.v = make_operand(c.dtype, {blocks, c.page, c.hk, c.dv}, 0, 1.0, false);
      in.block_table = shuffled_block_table(c);
      break;
    }
  }
  in.used_k = used_k_tensor(c);
  in.alibi = alibi_slopes(c);
  return in;
}

inline AttentionOptions options(const Case& c) {
  AttentionOptions o;
  o.causal = c.causal;
  o.window_left = c.wl;
  o.window_right = c.wr;
  o.softcap = c.softcap;
  o.dropout_p = c.dropout;
  o.dropout_seed = 0x1234567887654321ULL ^ (uint64_t)c.hq;
  o.dropout_offset = 7;
  return o;
}

struct FwdResult {
  HostTensor out, lse;  // out contiguous (b, sq, hq, dv) / (total_q, hq, dv)
};

/// The CPU oracle (Impl::reference) or baseline on the host inputs.
inline FwdResult run_cpu(const Case& c, const FwdInputs& in, Impl impl) {
  HostOperand out = make_operand(c.dtype, out_shape(c), c.layout == Layout::dense ? c.pad : 0, 1.0, true);
  FwdResult r{HostTensor(), HostTensor(DType::f32, lse_shape(c))};
  poison(r.lse);
  ForwardArgs a;
  a.q = in.q.view, a.k = in.k.view, a.v = in.v.view, a.out = out.view;
  a.lse = r.lse.view();
  a.options = options(c);
  if (c.alibi) a.options.alibi_slopes = in.alibi.view();
  if (c.layout == Layout::varlen) {
    a.layout.cu_seqlens_q = in.cu_q.view(), a.layout.cu_seqlens_k = in.cu_k.view();
    a.layout.max_seqlen_q = c.max_q(), a.layout.max_seqlen_k = c.max_k();
  }
  if (c.layout == Layout::paged) a.layout.block_table = in.block_table.view();
  if (!c.used_k.empty()) a.layout.seqused_k = in.used_k.view();
  a.impl = impl;
  forward(a);
  r.out = gather(out);
  return r;
}

/// The CUDA backend (Impl::automatic on device tensors) with poisoned outputs; `num_nan` counts
/// output elements it left unwritten.
struct GpuResult : FwdResult {
  int64_t out_nan = 0, lse_nan = 0;
};
/// The public forward's arguments over device copies of `in`, out and LSE poisoned (0xFF bytes = NaN),
/// kept alive together; built in place (views point into the members). `result` reads them back.
struct GpuForwardCall {
  DeviceTensor q, k, v;
  HostOperand out_host;
  DeviceTensor out;
  HostTensor lse_host;
  DeviceTensor lse;
  std::vector<DeviceTensor> keep;  // index tensors, ALiBi slopes
  ForwardArgs args;

  GpuForwardCall(const Case& c, const FwdInputs& in)
      : q(DeviceTensor::from_view(in.q.storage, in.q.view)),
        k(DeviceTensor::from_view(in.k.storage, in.k.view)),
        v(DeviceTensor::from_view(in.v.storage, in.v.view)),
        out_host(make_operand(c.dtype, out_shape(c), c.layout == Layout::dense ? c.pad : 0, 1.0, false)),
        out(DeviceTensor::from_view(out_host.storage, out_host.view)),
        lse_host(DType::f32, lse_shape(c)),
        lse(DeviceTensor::poisoned(lse_host)) {
    fill_bytes(out.mem.get(), 0xFF, out.bytes);
    keep.reserve(5);
    auto dev = [&](const HostTensor& h) {
      keep.push_back(DeviceTensor::from(h));
      return keep.back().view();
    };
    ForwardArgs& a = args;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view();
    a.lse = lse.view();
    a.options = options(c);
    if (c.alibi) a.options.alibi_slopes = dev(in.alibi);
    if (c.layout == Layout::varlen) {
      a.layout.cu_seqlens_q = dev(in.cu_q), a.layout.cu_seqlens_k = dev(in.cu_k);
      a.layout.max_seqlen_q = c.max_q(), a.layout.max_seqlen_k = c.max_k();
    }
    if (c.layout == Layout::paged) a.layout.block_table = dev(in.block_table);
    if (!c.used_k.empty()) a.layout.seqused_k = dev(in.used_k);
  }
  GpuForwardCall(const GpuForwardCall&) = delete;
  GpuForwardCall& operator=(const GpuForwardCall&) = delete;

  /// out and LSE after the run; unwritten elements and writes into the row padding counted as NaN.
  GpuResult result(const Case& c) {
    GpuResult r;
    out_host.storage = out.to_host(out_host.storage);
    out_host.view.data = out_host.storage.tv.data;  // make_operand views start at the buffer
    r.out = gather(out_host);
    r.lse = lse.to_host(lse_host);
    r.out_nan = count_nan(r.out), r.lse_nan = count_nan(r.lse);
    // Padding channels of the output must stay untouched (still poisoned).
    if (c.pad > 0) {
      const int64_t row = c.dv + c.pad, rows = out_host.storage.numel() / row;
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t ch = c.dv; ch < row; ++ch)
          if (!std::isnan(out_host.storage.get(i * row + ch))) ++r.out_nan;  // counted as a stray write
    }
    return r;
  }
};

/// flashport::check_device raises the index fault the device recorded, naming one of `args` (sequences
/// are checked in parallel: with several broken, any may be the one recorded), and then nothing.
inline void expect_device_fault(std::initializer_list<std::string> args, const std::string& fragment) {
  // The emulator does not run index_check.cu (its warp reductions are not emulated; emu_runtime turns
  // device checks off), so nothing is recorded there: the in-bounds part of these tests still runs.
  if (kEmulated) return;
  expect_recorded_fault(Device{DeviceType::cuda, 0}, "cuda", args, fragment);
}

inline GpuResult run_gpu(const Case& c, const FwdInputs& in) {
  GpuForwardCall call(c, in);
  forward(call.args);
  return call.result(c);
}

/// GPU forward vs the CPU oracle by the accuracy rule, for out and LSE; every element written.
inline void expect_forward_accurate(const Case& c) {
  SCOPED_TRACE(c.describe());
  const FwdInputs in = make_inputs(c);
  const GpuResult gpu = run_gpu(c, in);
  const FwdResult ref = run_cpu(c, in, Impl::reference);
  const FwdResult base = run_cpu(c, in, Impl::baseline);
  if (std::getenv("FLASHPORT_TEST_VERBOSE"))
    std::printf("%-150.150s out %.3g (base %.3g) lse %.3g (base %.3g)\n", c.describe().c_str(),
                max_abs_diff(gpu.out, ref.out), max_abs_diff(base.out, ref.out),
                max_abs_diff(gpu.lse, ref.lse), max_abs_diff(base.lse, ref.lse));
  EXPECT_EQ(gpu.out_nan, 0) << "output elements unwritten (or padding overwritten)";
  EXPECT_EQ(gpu.lse_nan, 0) << "LSE elements unwritten";
  EXPECT_TRUE(accuracy_rule(gpu.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(gpu.lse, base.lse, ref.lse)) << "lse";
}

}  // namespace flashport::test::gpu
