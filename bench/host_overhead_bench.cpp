// Host time of one C++ API call on a GPU: validation, dispatch, kernel lookup and launch, without the
// kernel. Calls are enqueued back to back on one stream (never waiting: the queue absorbs them) and
// the host clock is read around each batch; the median batch gives the time per call. Small problems
// (b 1, s 128, 16 heads, d 64, bf16, causal), where the host cost decides a call's wall time.
//   host_overhead_bench [--calls N] [--batches M] [--model b,s,h,d]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/attn_validate.hpp"
#include "core/backend.hpp"
#include "flashport/flashport.hpp"
#include "jit/jit.hpp"

using namespace flashport;

namespace {

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    ptr = jit::alloc_async(bytes, nullptr);
    jit::memset_async(ptr, 0, bytes, nullptr);
  }
  ~DeviceBuffer() { jit::free_async(ptr, nullptr); }
};

double median_us_per_call(const std::function<void()>& call, int calls, int batches) {
  for (int i = 0; i < 20; ++i) call();  // first use compiles or loads the kernels
  jit::stream_synchronize(nullptr);
  std::vector<double> per_call;
  for (int b = 0; b < batches; ++b) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) call();
    const auto stop = std::chrono::steady_clock::now();
    per_call.push_back(std::chrono::duration<double, std::micro>(stop - start).count() / calls);
    jit::stream_synchronize(nullptr);  // outside the timed region: the next batch starts on an idle queue
  }
  std::sort(per_call.begin(), per_call.end());
  return per_call[per_call.size() / 2];
}

/// Buffers and the forward / backward arguments of one causal bf16 call (b, s, h, d). `packed`: q, k, v
/// are views into one (b, s, 3, h, d) projection (row stride 3 h d), as a GPT block makes them.
struct AttnCall {
  DeviceBuffer qkv, o, lse, dout, dq, dk, dv;
  ForwardArgs fwd;
  BackwardArgs bwd;
  AttnCall(int64_t b, int64_t s, int64_t h, int64_t d, bool packed)
      : qkv(3 * b * s * h * d * 2),
        o(b * s * h * d * 2),
        lse(b * h * s * 4),
        dout(b * s * h * d * 2),
        dq(b * s * h * d * 2),
        dk(b * s * h * d * 2),
        dv(b * s * h * d * 2) {
    const Device gpu{DeviceType::cuda, 0};
    auto view = [&](void* p, DType t, std::initializer_list<int64_t> shape) {
      return TensorView::contiguous(p, t, shape, gpu);
    };
    auto input = [&](int which) {
      char* base = static_cast<char*>(qkv.ptr);
      if (!packed) return view(base + which * b * s * h * d * 2, DType::bf16, {b, s, h, d});
      TensorView t = view(base + which * d * 2, DType::bf16, {b, s, h, d});
      t.stride[0] = s * 3 * h * d, t.stride[1] = 3 * h * d;
      return t;
    };
    fwd.q = input(0), fwd.k = input(1), fwd.v = input(2);
    fwd.out = view(o.ptr, DType::bf16, {b, s, h, d});
    fwd.lse = view(lse.ptr, DType::f32, {b, h, s});
    fwd.options.causal = true;
    bwd.q = fwd.q, bwd.k = fwd.k, bwd.v = fwd.v, bwd.out = fwd.out, bwd.lse = *fwd.lse;
    bwd.dout = view(dout.ptr, DType::bf16, {b, s, h, d});
    bwd.dq = view(dq.ptr, DType::bf16, {b, s, h, d});
    bwd.dk = view(dk.ptr, DType::bf16, {b, s, h, d});
    bwd.dv = view(dv.ptr, DType::bf16, {b, s, h, d});
    bwd.options.causal = true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int calls = 200, batches = 21;
  int64_t model[4] = {8, 1024, 12, 64};
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model"))
      std::sscanf(argv[i + 1], "%ld,%ld,%ld,%ld", &model[0], &model[1], &model[2], &model[3]);
    if (!std::strcmp(argv[i], "--calls")) calls = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--batches")) batches = std::max(1, std::atoi(argv[i + 1]));
  }
  if (jit::device_count() == 0) {
    std::printf("no CUDA device visible: nothing to time (this benchmark measures the GPU call path)\n");
    return 0;
  }
  const Device gpu{DeviceType::cuda, 0};
  AttnCall small(1, 128, 16, 64, /*packed=*/false);
  const ForwardArgs& fwd = small.fwd;
  const BackwardArgs& bwd = small.bwd;
  auto view = [&](void* p, DType t, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(p, t, shape, gpu);
  };

  // Decode: one token against a 1k cache, GQA 32/8, d 128.
  const int64_t ctx = 1024, hq = 32, hk = 8, dh = 128;
  DeviceBuffer dq_tok(hq * dh * 2), kc(ctx * hk * dh * 2), vc(ctx * hk * dh * 2), o_tok(hq * dh * 2),
      seqlens(4);
  KvCacheArgs kv;
  kv.q = view(dq_tok.ptr, DType::bf16, {1, 1, hq, dh});
  kv.k_cache = view(kc.ptr, DType::bf16, {1, ctx, hk, dh});
  kv.v_cache = view(vc.ptr, DType::bf16, {1, ctx, hk, dh});
  kv.out = view(o_tok.ptr, DType::bf16, {1, 1, hq, dh});
  // cache_seqlens on the device, as serving engines keep it (zeros here: the host path does not read it).
  kv.cache_seqlens = view(seqlens.ptr, DType::i32, {1});
  kv.options.causal = true;

  std::printf("host time per C++ call, %d calls x %d batches (median), %s\n", calls, batches,
              jit::device_name(0).c_str());
  const double t_fwd = median_us_per_call([&] { forward(fwd); }, calls, batches);
  std::printf("  forward  (b 1, s 128, h 16, d 64, causal, bf16): %7.2f us\n", t_fwd);
  const double t_bwd = median_us_per_call([&] { backward(bwd); }, calls, batches);
  std::printf("  backward (same problem, 3 launches + scratch):   %7.2f us\n", t_bwd);
  // Few calls per batch: a backward's kernels can take longer on the GPU than its host call, and
  // hundreds queued back to back then wait for queue slots (the time above becomes GPU time).
  const double t_bwd_few = median_us_per_call([&] { backward(bwd); }, 8, batches * 4);
  std::printf("  backward, 8 calls per batch (no queue back-pressure): %7.2f us\n", t_bwd_few);
  const double t_scratch = median_us_per_call(
      [&] { jit::free_async(jit::alloc_async(1 << 20, nullptr), nullptr); }, calls, batches);
  std::printf("    scratch cuMemAllocAsync + cuMemFreeAsync (1 MiB): %7.2f us\n", t_scratch);
  const double t_memset =
      median_us_per_call([&] { jit::memset_async(small.dq.ptr, 0, 4096, nullptr); }, 8, batches * 4);
  std::printf("    memset_async (4 KiB):                           %7.2f us\n", t_memset);
  const double t_kv = median_us_per_call([&] { forward_kvcache(kv); }, calls, batches);
  std::printf("  forward_kvcache (1 token, 1k cache, GQA 32/8):    %7.2f us\n", t_kv);

  // As a GPT block calls it: q, k, v views into one (b, s, 3, h, d) projection (row stride 3 h d), at a
  // training shape (--model b,s,h,d; default GPT-2 small at 8 x 1024). Few calls per batch, since
  // these kernels take longer on the GPU than the call on the host.
  {
    const int64_t mb = model[0], ms = model[1], mh = model[2], md = model[3];
    AttnCall call(mb, ms, mh, md, /*packed=*/true);
    std::printf(
        "model shape b %lld, s %lld, h %lld, d %lld, q/k/v views of one qkv projection, 4 calls per batch:\n",
        (long long)mb, (long long)ms, (long long)mh, (long long)md);
    std::printf("  forward:  %7.2f us\n", median_us_per_call([&] { forward(call.fwd); }, 4, batches * 4));
    std::printf("  backward: %7.2f us\n", median_us_per_call([&] { backward(call.bwd); }, 4, batches * 4));
  }

  // Where the forward's time goes: validation into the problem block, the backend's support check,
  // its launch (kernel lookup + cuLaunchKernelEx), and the one driver query the support check makes.
  std::printf("parts of the forward:\n");
  const AttnProblem p = core::build_attention(fwd.q, fwd.k, fwd.v, fwd.out, fwd.options, fwd.layout, nullptr);
  const core::Backend* be = core::backend_for(DeviceType::cuda);
  const double t_validate = median_us_per_call(
      [&] {
        AttnProblem v = core::build_attention(fwd.q, fwd.k, fwd.v, fwd.out, fwd.options, fwd.layout, nullptr);
        core::attach_lse(v, *fwd.lse, gpu);
      },
      calls, batches);
  std::printf("  validation (build_attention + attach_lse):        %7.2f us\n", t_validate);
  const double t_support =
      median_us_per_call([&] { (void)be->unsupported(p, Impl::automatic, false); }, calls, batches);
  std::printf("  backend support check:                            %7.2f us\n", t_support);
  const double t_pointer =
      median_us_per_call([&] { (void)jit::pointer_device(small.qkv.ptr); }, calls, batches);
  std::printf("    of which cuPointerGetAttribute:                 %7.2f us\n", t_pointer);
  AttnProblem with_lse = p;
  core::attach_lse(with_lse, *fwd.lse, gpu);
  const double t_launch = median_us_per_call([&] { be->forward(with_lse, Impl::automatic); }, calls, batches);
  std::printf("  backend forward (choice, kernel lookup, launch):  %7.2f us\n", t_launch);
  return 0;
}
