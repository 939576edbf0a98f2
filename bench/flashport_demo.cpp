// flashport_demo: random inputs through the best backend present (the CPU here, plus the GPU when the
// "cuda" backend is available and the demo was built with its CUDA path), checked against the fp64
// reference by SPEC's accuracy rule on a slice; prints a short table, exits non-zero on any failure.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "flashport/flashport.hpp"

// The GPU run needs device memory from the CUDA runtime. Build with -DFLASHPORT_DEMO_WITH_CUDA and link
// CUDA::cudart (bench/CMakeLists.txt) to enable it; without that the demo reports the GPU as skipped.
#if defined(FLASHPORT_DEMO_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

using flashport::DType;
using flashport::Impl;
using flashport::TensorView;

struct Case {
  const char* name;
  DType dtype;
  int64_t b, s, hq, hk, d;
  bool causal;
  int64_t window_left;  // -1: none
  double softcap;
  bool backward;
};

constexpr Case kCases[] = {
    {"mha causal", DType::f32, 2, 512, 8, 8, 64, true, -1, 0.0, false},
    {"gqa 4:1", DType::bf16, 1, 1024, 8, 2, 128, false, -1, 0.0, false},
    {"sliding window + softcap", DType::f16, 1, 768, 4, 4, 64, true, 128, 30.0, false},
    {"mqa decode-like", DType::bf16, 4, 1, 16, 1, 128, false, -1, 0.0, false},
    {"fwd+bwd causal", DType::bf16, 1, 512, 4, 4, 64, true, -1, 0.0, true},
};

/// A contiguous host buffer of one dtype; `normal` fills fresh N(0, 1) values.
struct Host {
  std::vector<unsigned char> bytes;
  TensorView tv;
  Host(DType dtype, std::initializer_list<int64_t> shape, std::mt19937_64* normal = nullptr) {
    int64_t n = 1;
    for (int64_t e : shape) n *= e;
    bytes.assign((size_t)(n * flashport::dtype_size(dtype)), 0);
    tv = TensorView::contiguous(bytes.data(), dtype, shape);
    if (!normal) return;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> values((size_t)n);
    for (float& v : values) v = nd(*normal);
    flashport::cast(TensorView::contiguous(values.data(), DType::f32, {n}),
                    TensorView::contiguous(bytes.data(), dtype, {n}));
  }
  /// Rows [r0, r0 + rows) of batch 0 of a (b, s, h, d) buffer, as a (1, rows, h, d) view.
  TensorView rows(int64_t r0, int64_t n) const {
    TensorView v = tv;
    v.data = (unsigned char*)tv.data + r0 * tv.stride[1] * flashport::dtype_size(tv.dtype);
    v.shape[0] = 1;
    v.shape[1] = n;
    return v;
  }
};

using bench::max_abs;
using bench::max_diff;

flashport::AttentionOptions options(const Case& c) {
  flashport::AttentionOptions o;
  o.causal = c.causal;
  o.window_left = c.window_left;
  o.softcap = c.softcap;
  return o;
}

double flops(const Case& c) {
  double pairs = 0.0;  // visible (i, j) pairs of one head (sq = sk, bottom-right aligned)
  for (int64_t i = 0; i < c.s; ++i) {
    const int64_t hi = c.causal ? i + 1 : c.s,
                  lo = c.window_left < 0 ? 0 : std::max<int64_t>(0, i - c.window_left);
    pairs += (double)(hi - lo);
  }
  return 2.0 * pairs * (double)(2 * c.d) * (double)(c.b * c.hq) * (c.backward ? 3.5 : 1.0);
}

struct Inputs {
  Host q, k, v, dout;
};

/// The fp64 reference and the same-precision baseline on the last rows of batch 0 (bottom-right
/// alignment keeps those rows' masks equal to the full problem's), and for backward the reference dQ.
struct Check {
  Host ref_out, base_out, ref_dq;
  int64_t r0, rows;
};

Check reference_slice(const Case& c, const Inputs& in) {
  const int64_t rows = std::min<int64_t>(c.s, 40), r0 = c.s - rows;
  Check ch{Host(c.dtype, {1, rows, c.hq, c.d}), Host(c.dtype, {1, rows, c.hq, c.d}),
           Host(c.dtype, {1, rows, c.hq, c.d}), r0, rows};
  std::vector<float> lse((size_t)(c.hq * rows));
  flashport::ForwardArgs a;
  a.q = in.q.rows(r0, rows), a.k = in.k.rows(0, c.s), a.v = in.v.rows(0, c.s);
  a.options = options(c);
  a.out = ch.ref_out.tv;
  a.lse = TensorView::contiguous(lse.data(), DType::f32, {1, c.hq, rows});
  a.impl = Impl::reference;
  flashport::forward(a);
  if (c.backward) {
    Host dk(c.dtype, {1, c.s, c.hk, c.d}), dv(c.dtype, {1, c.s, c.hk, c.d});
    flashport::BackwardArgs ba;
    ba.dout = in.dout.rows(r0, rows), ba.q = a.q, ba.k = a.k, ba.v = a.v, ba.out = ch.ref_out.tv,
    ba.lse = *a.lse;
    ba.dq = ch.ref_dq.tv, ba.dk = dk.tv, ba.dv = dv.tv;
    ba.options = a.options;
    ba.impl = Impl::reference;
    flashport::backward(ba);
  }
  a.out = ch.base_out.tv;
  a.lse.reset();
  a.impl = Impl::baseline;
  flashport::forward(a);
  return ch;
}

struct Result {
  double ms, err, bound;
  bool pass;
};

/// Compares a run's output (and dQ) rows with the reference slice by SPEC's rule; dQ (no baseline
/// backward exists) within 3 rounding steps of the dtype relative to max|dQ|, as the tests do.
Result judge(const Case& c, const Check& ch, const Host& out, const Host* dq, double ms) {
  Result r{ms, 0.0, 0.0, false};
  const double base = max_diff(ch.base_out.tv, ch.ref_out.tv);
  r.err = max_diff(out.rows(ch.r0, ch.rows), ch.ref_out.tv);
  r.bound = 2.0 * base + 1e-5;
  r.pass = r.err <= r.bound;
  if (dq) {
    const double step = c.dtype == DType::bf16 ? 0x1p-8 : c.dtype == DType::f16 ? 0x1p-11 : 0x1p-17;
    const double dq_err = max_diff(dq->rows(ch.r0, ch.rows), ch.ref_dq.tv);
    const double dq_bound = 3.0 * step * max_abs(ch.ref_dq.tv) + 1e-5;
    r.pass = r.pass && dq_err <= dq_bound;
    if (dq_err / dq_bound > r.err / r.bound) r.err = dq_err, r.bound = dq_bound;
  }
  return r;
}

template <class F>
double median_ms(F&& body) {
  body();
  std::vector<double> ms;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[1];
}

Result run_cpu(const Case& c, const Inputs& in, const Check& ch) {
  Host out(c.dtype, {c.b, c.s, c.hq, c.d}), dq(c.dtype, {c.b, c.s, c.hq, c.d});
  Host dk(c.dtype, {c.b, c.s, c.hk, c.d}), dv(c.dtype, {c.b, c.s, c.hk, c.d});
  std::vector<float> lse((size_t)(c.b * c.hq * c.s));
  flashport::ForwardArgs a;
  a.q = in.q.tv, a.k = in.k.tv, a.v = in.v.tv, a.out = out.tv;
  a.lse = TensorView::contiguous(lse.data(), DType::f32, {c.b, c.hq, c.s});
  a.options = options(c);
  flashport::BackwardArgs ba;
  ba.dout = in.dout.tv, ba.q = a.q, ba.k = a.k, ba.v = a.v, ba.out = out.tv, ba.lse = *a.lse;
  ba.dq = dq.tv, ba.dk = dk.tv, ba.dv = dv.tv;
  ba.options = a.options;
  const double ms = median_ms([&] {
    flashport::forward(a);
    if (c.backward) flashport::backward(ba);
  });
  return judge(c, ch, out, c.backward ? &dq : nullptr, ms);
}

#if defined(FLASHPORT_DEMO_WITH_CUDA)
/// The same case on GPU 0: inputs copied to the device, timed around a device synchronisation.
/// Not exercised on the development machine (no GPU there).
Result run_cuda(const Case& c, const Inputs& in, const Check& ch) {
  auto to_device = [](const Host& h) {
    void* p = nullptr;
    cudaMalloc(&p, h.bytes.size());
    cudaMemcpy(p, h.bytes.data(), h.bytes.size(), cudaMemcpyHostToDevice);
    TensorView v = h.tv;
    v.data = p;
    v.device = {flashport::DeviceType::cuda, 0};
    return v;
  };
  Host out(c.dtype, {c.b, c.s, c.hq, c.d}), dq(c.dtype, {c.b, c.s, c.hq, c.d});
  Host dk(c.dtype, {c.b, c.s, c.hk, c.d}), dv(c.dtype, {c.b, c.s, c.hk, c.d});
  Host lse(DType::f32, {c.b, c.hq, c.s});
  const TensorView d_q = to_device(in.q), d_k = to_device(in.k), d_v = to_device(in.v),
                   d_do = to_device(in.dout);
  const TensorView d_out = to_device(out), d_lse = to_device(lse), d_dq = to_device(dq), d_dk = to_device(dk),
                   d_dv = to_device(dv);
  flashport::ForwardArgs a;
  a.q = d_q, a.k = d_k, a.v = d_v, a.out = d_out, a.lse = d_lse;
  a.options = options(c);
  flashport::BackwardArgs ba;
  ba.dout = d_do, ba.q = d_q, ba.k = d_k, ba.v = d_v, ba.out = d_out, ba.lse = d_lse;
  ba.dq = d_dq, ba.dk = d_dk, ba.dv = d_dv;
  ba.options = a.options;
  const double ms = median_ms([&] {
    flashport::forward(a);
    if (c.backward) flashport::backward(ba);
    cudaDeviceSynchronize();
  });
  cudaMemcpy(out.bytes.data(), d_out.data, out.bytes.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(dq.bytes.data(), d_dq.data, dq.bytes.size(), cudaMemcpyDeviceToHost);
  for (const TensorView* t : {&d_q, &d_k, &d_v, &d_do, &d_out, &d_lse, &d_dq, &d_dk, &d_dv})
    cudaFree(t->data);
  return judge(c, ch, out, c.backward ? &dq : nullptr, ms);
}
#endif

}  // namespace

int main() {
  const std::string backends = flashport::available_backends();
  const bool has_cuda = backends.find("cuda") != std::string::npos;
  std::printf("flashport %s, backends: %s\n", flashport::version(), backends.c_str());
#if !defined(FLASHPORT_DEMO_WITH_CUDA)
  if (has_cuda)
    std::printf("note: the cuda backend is present but this demo was built without its GPU path\n");
#endif
  std::printf("\n%-26s %-24s %-5s %-7s %10s %9s %10s %10s  %s\n", "case", "shape (b,s,hq,hk,d)", "dtype",
              "backend", "time ms", "GFLOPS", "max err", "bound", "pass");
  std::mt19937_64 gen(std::random_device{}());
  int failures = 0;
  for (const Case& c : kCases) {
    Inputs in{Host(c.dtype, {c.b, c.s, c.hq, c.d}, &gen), Host(c.dtype, {c.b, c.s, c.hk, c.d}, &gen),
              Host(c.dtype, {c.b, c.s, c.hk, c.d}, &gen), Host(c.dtype, {c.b, c.s, c.hq, c.d}, &gen)};
    const Check ch = reference_slice(c, in);
    std::vector<std::pair<const char*, Result>> results{{"cpu", run_cpu(c, in, ch)}};
#if defined(FLASHPORT_DEMO_WITH_CUDA)
    if (has_cuda) results.push_back({"cuda", run_cuda(c, in, ch)});
#endif
    char shape[64];
    std::snprintf(shape, sizeof shape, "(%lld,%lld,%lld,%lld,%lld)", (long long)c.b, (long long)c.s,
                  (long long)c.hq, (long long)c.hk, (long long)c.d);
    for (const auto& [backend, r] : results) {
      failures += r.pass ? 0 : 1;
      std::printf("%-26s %-24s %-5s %-7s %10.2f %9.1f %10.2e %10.2e  %s\n", c.name, shape,
                  flashport::dtype_name(c.dtype), backend, r.ms, flops(c) / r.ms / 1e6, r.err, r.bound,
                  r.pass ? "yes" : "NO");
    }
  }
  std::printf("\n%s\n",
              failures ? "FAILED" : "all cases pass (SPEC accuracy rule against the fp64 reference)");
  return failures ? 1 : 0;
}
