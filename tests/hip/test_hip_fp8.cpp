// The CDNA fp8 forward (Kernel<bf16, d, false, kFp8 = true>) on the CPU wave64 model against the CPU
// reference on the same fp8 inputs and descales (hip_fp8_inputs.hpp: SPEC's accuracy rule with a bf16
// baseline): each fp8 format, causal or not, GQA, varlen with empty sequences, paged K/V, odd lengths,
// padded head dims, each output dtype; outputs and LSE poisoned first. And the decode itself, exhaustively.
#include <gtest/gtest.h>

#include <cmath>

#include "core/attn_validate.hpp"
#include "hip_fp8_inputs.hpp"
#include "hip_model_forward.hpp"

namespace flashport::test {
namespace {

constexpr DType kFp8Types[] = {DType::e4m3fnuz, DType::e4m3, DType::e5m2};

/// Out (dtype `out`) and LSE of `c` from the model kernel on the fp8 inputs with their descales.
fastcheck::Forward run_model(const Case& c, const fp8check::Inputs& in, DType out, bool vec) {
  fastcheck::Forward got = fp8check::outputs(c, out);
  const ForwardArgs a = fp8check::args(c, in.fp8, in.descale, got, Impl::automatic);
  AttnProblem p = core::build_attention(a.q, a.k, a.v, a.out, a.options, a.layout, nullptr);
  core::attach_lse(p, got.lse, Device{});
  EXPECT_TRUE(p.q_descale && p.k_descale && p.v_descale);
  hipmodel::forward(p, vec);
  return got;
}

void check(const Case& c, DType out = DType::bf16, bool vec = true) {
  SCOPED_TRACE(c.describe() + " out " + dtype_name(out) + (vec ? "" : " (byte loads)"));
  const fp8check::Inputs in = fp8check::make(c);
  fp8check::expect_accurate(run_model(c, in, out, vec), c, in);
}

/// Every code of every format decodes to core/numeric.h's value (NaN to a NaN, -0 to -0).
TEST(HipModelFp8, DecodeMatchesTheCpuConversion) {
  const std::pair<int, num::Fp8Format> formats[] = {
      {kE4M3, num::kE4M3}, {kE4M3FNUZ, num::kE4M3FNUZ}, {kE5M2, num::kE5M2}};
  for (const auto& [type, fmt] : formats) {
    const amd::Fp8Decode f = amd::fp8_decode(type);
    for (unsigned x = 0; x < 256; ++x) {
      const float want = num::fp8_to_f32((num::u8)x, fmt);
      const float got = num::bf16_to_f32(amd::fp8_to_bf16(x, f));
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "type " << type << " code " << x;
      } else {
        EXPECT_EQ(num::f32_bits(got), num::f32_bits(want)) << "type " << type << " code " << x;
      }
    }
  }
}

TEST(HipModelFp8, EachFormatOddLengthsGqa) {
  for (DType t : kFp8Types) {
    Case c = dense(t, 1, 113, 203, 4, 2, 64, 64);
    check(c);
    c.causal = true;
    check(c);
  }
}

TEST(HipModelFp8, OutputDtypes) {
  Case c = dense(DType::e4m3fnuz, 2, 70, 90, 2, 1, 128, 128);
  c.causal = true;
  for (DType out : {DType::bf16, DType::f16, DType::f32}) check(c, out);
}

TEST(HipModelFp8, VarlenWithEmptySequences) {
  for (DType t : {DType::e4m3fnuz, DType::e5m2}) {
    Case c;
    c.dtype = t, c.layout = Layout::varlen, c.hq = 4, c.hk = 2, c.d = c.dv = 128;
    c.q_lens = {0, 70, 1, 33}, c.k_lens = {5, 0, 40, 90};
    check(c);
    c.causal = true;
    check(c, DType::f32);
  }
}

TEST(HipModelFp8, PagedKvAndScoreVariants) {
  Case c;
  c.dtype = DType::e4m3, c.layout = Layout::paged, c.hq = 4, c.hk = 2, c.d = c.dv = 64;
  c.q_lens = {9, 9}, c.k_lens = {100, 100}, c.page = 16, c.causal = true;
  check(c);
  c = dense(DType::e4m3fnuz, 1, 50, 90, 2, 1, 64, 64);
  c.softcap = 5.0, c.q_stddev = 3.0;
  check(c);
  c.softcap = 0.0, c.q_stddev = 1.0, c.alibi = 1, c.wl = 20, c.wr = 0;
  check(c);
}

TEST(HipModelFp8, HeadDimBuckets) {
  check(dense(DType::e4m3fnuz, 1, 40, 50, 2, 2, 40, 40));      // bucket 64, padded
  check(dense(DType::e4m3fnuz, 1, 33, 47, 2, 1, 112, 112));    // bucket 128, padded
  Case c = dense(DType::e4m3fnuz, 1, 21, 75, 2, 2, 256, 256);  // 32-key tiles
  c.causal = true;
  check(c, DType::f16);
}

TEST(HipModelFp8, UnalignedRowsTakeTheBytePath) {
  check(dense(DType::e5m2, 1, 30, 45, 1, 1, 64, 64), DType::f32, /*vec=*/false);
  check(dense(DType::e4m3fnuz, 1, 30, 45, 1, 1, 64, 64), DType::bf16, /*vec=*/false);
}

}  // namespace
}  // namespace flashport::test
