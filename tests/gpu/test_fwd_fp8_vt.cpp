// The Hopper fp8 forward's V^T pass (kernels/cuda/hopper/fp8_v_transpose.cu) launched on its own: every
// slot of every sequence's region (fp8_vt_start, rounded up to 128 keys) holds V's byte of the key
// fp8_key_of_slot names, or 0 past the sequence's length; dense and varlen (empty sequences, 300 keys: three
// blocks), GQA-shaped kv heads, d 64 / 128 / 256. Runs on any CUDA GPU and under the kernel emulator, which
// is where the pass is checked until the fp8 forward itself runs on a Hopper GPU.
#include "backends/cuda/sm90/hopper_fwd.hpp"
#include "backends/cuda/variants.hpp"
#include "core/attn_validate.hpp"
#include "gpu/gpu_fp8_util.hpp"
#include "kernels/cuda/hopper/fwd_sm90_config.h"

namespace flashport::test::gpu {
namespace {

namespace hopper = cuda::hopper;

/// `v_shift`: V starts that many bytes past a 16-byte boundary (not a multiple of 16: the pass's byte loads).
void expect_vt_layout(const Case& c, size_t v_shift = 0) {
  SCOPED_TRACE(c.describe() + " v_shift " + std::to_string(v_shift));
  const fp8check::Inputs in = fp8check::make(c);
  DeviceCopies dev;
  fastcheck::Inputs d;
  d.q = dev.shell(in.fp8.q), d.k = dev.shell(in.fp8.k), d.v = dev.shell(in.fp8.v, v_shift);
  d.cu_q = dev.shell(in.fp8.cu_q), d.cu_k = dev.shell(in.fp8.cu_k), d.used_k = dev.shell(in.fp8.used_k);
  fastcheck::Forward f = fp8check::outputs(c, DType::bf16);
  DeviceTensor d_out = DeviceTensor::from(f.out);
  f.out.tv = d_out.view();
  const bool varlen = c.layout == Layout::varlen;
  const ForwardArgs a = fp8check::args(c, d, nullptr, f, Impl::automatic);
  const AttnProblem p = core::build_attention(a.q, a.k, a.v, a.out, a.options, a.layout, nullptr);
  const long long keys = hopper::fp8_vt_keys(p), slabs = p.cu_seqlens_k ? 1 : p.batch;
  const size_t bytes = (size_t)(slabs * p.hk * p.dv * keys);
  DevicePtr vt(device_alloc(bytes));
  fill_bytes(vt.get(), 0xAB, bytes);  // slots outside every region keep this
  hopper::Fp8VtParams prm{p, static_cast<unsigned char*>(vt.get()), keys};
  void* args[] = {&prm};
  const jit::Kernel& kernel = cuda::cached_kernel(hopper::fp8_transpose_spec, 0, 0, jit::device_arch(0));
  const long long blocks = (p.sk + hopper::kFp8VtKeys - 1) / hopper::kFp8VtKeys;
  jit::launch(kernel, (unsigned)blocks, (unsigned)p.hk, (unsigned)p.batch, 256, 0, nullptr, args);
  std::vector<unsigned char> got(bytes);
  copy_bytes(got.data(), vt.get(), bytes, cudaMemcpyDeviceToHost);

  // fp8_vt_start reads cu_seqlens_k: on the host, from the host copy (p's is a device pointer).
  AttnProblem p_host = p;
  if (varlen) p_host.cu_seqlens_k = reinterpret_cast<const int*>(in.fp8.cu_k.bytes.data());
  const unsigned char* v = in.fp8.v.bytes.data();
  int64_t wrong = 0, checked = 0;
  for (int64_t b = 0; b < c.batch(); ++b) {
    const int64_t len = c.k_lens[(size_t)b], first = varlen ? fp8check::i32_at(in.fp8.cu_k, b) : 0;
    const int64_t start = hopper::fp8_vt_start(p_host, b), rounded = (len + 127) / 128 * 128;
    for (int64_t h = 0; h < c.hk; ++h)
      for (int64_t ch = 0; ch < c.dv; ++ch)
        for (int64_t s = 0; s < rounded; ++s) {
          const int64_t key = (s & ~31) + hopper::fp8_key_of_slot((int)(s & 31));
          const int64_t row = varlen ? first + key : b * c.k_lens[0] + key;
          const unsigned char want = key < len ? v[(row * c.hk + h) * c.dv + ch] : 0;
          const int64_t slab = varlen ? 0 : b;
          wrong += got[(size_t)(((slab * c.hk + h) * c.dv + ch) * keys + start + s)] != want ? 1 : 0;
          ++checked;
        }
  }
  EXPECT_EQ(wrong, 0) << "of " << checked << " slots";
  EXPECT_GT(checked, 0);
}

TEST(GpuFp8VTranspose, DenseAndVarlenRegions) {
  FP_SKIP_WITHOUT_GPU();
  if (cpu_mode()) GTEST_SKIP() << "a kernel launched directly: no CPU stand-in";
  expect_vt_layout(dense(DType::e4m3, 2, 1, 300, 4, 2, 128));
  expect_vt_layout(dense(DType::e4m3, 1, 1, 77, 2, 1, 64));
  expect_vt_layout(dense(DType::e4m3, 1, 1, 129, 2, 2, 256));
  expect_vt_layout(varlen(dense(DType::e4m3, 1, 1, 1, 2, 1, 128), {1, 1, 1, 1, 1}, {0, 130, 7, 300, 0}));
  expect_vt_layout(dense(DType::e4m3, 2, 1, 300, 4, 2, 128), 1);
  expect_vt_layout(dense(DType::e4m3, 1, 1, 200, 2, 1, 64), 4);
  expect_vt_layout(varlen(dense(DType::e4m3, 1, 1, 1, 2, 1, 256), {1, 1, 1}, {5, 0, 260}), 8);
}

}  // namespace
}  // namespace flashport::test::gpu
