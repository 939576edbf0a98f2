// Tests of the shared semantics (Philox known answers, masks, rotary taps) and the bit-exact conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/numeric.h"
#include "core/semantics.h"

namespace flashport {
namespace {

using sem::u32;

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 and dropout.

void expect_philox(std::array<u32, 4> c, std::array<u32, 2> k, std::array<u32, 4> want) {
  const sem::Philox4 r = sem::philox4x32_10(c[0], c[1], c[2], c[3], k[0], k[1]);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(r.x[w], want[w]) << "word " << w;
}

TEST(SemanticsPhilox, KnownAnswersFromSpec) {
  expect_philox({0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  const u32 ones = 0xffffffffu;
  expect_philox({ones, ones, ones, ones}, {ones, ones}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  expect_philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
                {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST(SemanticsDropout, ThresholdIsFloorOfPTimes2To32) {
  EXPECT_EQ(sem::dropout_threshold(0.0), 0u);
  EXPECT_EQ(sem::dropout_threshold(0.5), 0x80000000u);
  EXPECT_EQ(sem::dropout_threshold(0.25), 0x40000000u);
  EXPECT_EQ(sem::dropout_threshold(0.1), 429496729u);          // 0.1 * 2^32 = 429496729.6
  EXPECT_EQ(sem::dropout_threshold(1.0 - 1e-9), 4294967291u);  // 2^32 - 4.29...
  EXPECT_EQ(sem::dropout_threshold(1.0), 0xffffffffu);
}

TEST(SemanticsDropout, KeepReadsWordJMod4OfTheSpecCounter) {
  const unsigned long long seed = 0x0123456789abcdefull;
  const u32 offset = 77, threshold = sem::dropout_threshold(0.5);
  const long long hq = 5;
  int kept = 0, total = 0;
  for (long long b = 0; b < 2; ++b)
    for (long long h = 0; h < hq; ++h)
      for (long long i = 0; i < 9; ++i)
        for (long long j = 0; j < 13; ++j) {
          const sem::Philox4 w =
              sem::philox4x32_10((u32)(j / 4), (u32)i, (u32)(b * hq + h), offset, 0x89abcdefu, 0x01234567u);
          const bool keep = sem::dropout_keep(seed, offset, threshold, i, j, b, hq, h);
          ASSERT_EQ(keep, w.x[j % 4] >= threshold) << b << " " << h << " " << i << " " << j;
          kept += keep;
          ++total;
        }
  EXPECT_GT(kept, total / 3);
  EXPECT_LT(kept, 2 * total / 3);
  // Threshold 0 (p = 0) keeps everything.
  for (long long j = 0; j < 64; ++j) EXPECT_TRUE(sem::dropout_keep(seed, offset, 0u, 3, j, 1, hq, 2));
}

// ---------------------------------------------------------------------------------------------
// Masks: the visible key range against the SPEC formula evaluated by brute force.

bool spec_visible(long long i, long long j, long long sq, long long sk, long long wl, long long wr) {
  const long long r = i + sk - sq;
  const bool left_ok = wl < 0 || j >= r - wl;
  const bool right_ok = wr < 0 || j <= r + wr;
  return j >= 0 && j < sk && left_ok && right_ok;
}

TEST(SemanticsMask, VisibleKeysMatchesSpecFormula) {
  const long long shapes[][2] = {{1, 1}, {5, 5}, {3, 9}, {9, 3}, {7, 1}, {1, 7}, {0, 4}, {4, 0}};
  const long long windows[][2] = {{-1, -1}, {-1, 0}, {0, 0},  {2, 0},    {0, 3},
                                  {1, 1},   {-1, 2}, {3, -1}, {100, 100}};
  for (const auto& sh : shapes)
    for (const auto& w : windows)
      for (long long i = 0; i < sh[0]; ++i) {
        const sem::KeyRange kr = sem::visible_keys(i, sh[0], sh[1], w[0], w[1]);
        EXPECT_GE(kr.lo, 0);
        EXPECT_LE(kr.hi, sh[1]);
        for (long long j = -2; j < sh[1] + 2; ++j) {
          const bool want = spec_visible(i, j, sh[0], sh[1], w[0], w[1]);
          EXPECT_EQ(j >= kr.lo && j < kr.hi, want)
              << sh[0] << "x" << sh[1] << " w=" << w[0] << "," << w[1] << " i=" << i << " j=" << j;
          if (j >= 0 && j < sh[1]) {
            EXPECT_EQ(sem::is_visible(i, j, sh[0], sh[1], w[0], w[1]), want);
          }
        }
      }
}

TEST(SemanticsMask, CausalBottomRightLeavesFirstRowsEmptyWhenSqExceedsSk) {
  // sq = 6, sk = 2, causal: rows 0..3 see nothing, row 4 sees key 0, row 5 keys 0..1.
  for (long long i = 0; i < 4; ++i) {
    const sem::KeyRange kr = sem::visible_keys(i, 6, 2, -1, 0);
    EXPECT_GE(kr.lo, kr.hi) << i;
  }
  EXPECT_EQ(sem::visible_keys(4, 6, 2, -1, 0).hi, 1);
  EXPECT_EQ(sem::visible_keys(5, 6, 2, -1, 0).hi, 2);
}

TEST(SemanticsScores, SoftcapAlibiAndWeights) {
  EXPECT_EQ(sem::softcap(3.0, 0.0), 3.0);
  EXPECT_NEAR(sem::softcap(3.0, 2.0), 2.0 * std::tanh(1.5), 1e-15);
  for (double s : {-4.0, -0.3, 0.0, 0.7, 5.0}) {
    const double cap = 1.7, h = 1e-6;
    const double fd = (sem::softcap(s + h, cap) - sem::softcap(s - h, cap)) / (2 * h);
    EXPECT_NEAR(sem::softcap_grad(sem::softcap(s, cap), cap), fd, 1e-8) << s;
  }
  EXPECT_EQ(sem::softcap_grad(2.0, 0.0), 1.0);
  EXPECT_EQ(sem::alibi_bias(0.5, 2, 7, 4, 10), -0.5 * 1.0);  // r = 2 + 10 - 4 = 8, |8 - 7| = 1
  EXPECT_EQ(sem::alibi_bias(0.25, 0, 9, 3, 3), -0.25 * 9.0);
  EXPECT_EQ(sem::lse_weight<double>(-INFINITY, -INFINITY), 0.0);
  EXPECT_EQ(sem::lse_weight<double>(-INFINITY, 3.0), 0.0);
  EXPECT_NEAR(sem::lse_weight(1.0, 3.0), std::exp(-2.0), 1e-15);
}

TEST(SemanticsRotary, ChannelRotatesPairsInFp32WithoutFma) {
  // rotary_channel: x[c] cos + sign x[partner] sin, each product and the sum rounded to fp32.
  const int rot = 16;
  std::mt19937 gen(9);
  std::normal_distribution<float> nd;
  for (bool interleaved : {true, false}) {
    std::vector<float> x(rot), cs(rot / 2), sn(rot / 2);
    for (auto& v : x) v = nd(gen);
    for (int k = 0; k < rot / 2; ++k) cs[k] = std::cos(nd(gen)), sn[k] = std::sin(nd(gen));
    for (int c = 0; c < rot; ++c) {
      const sem::RotaryTap t = sem::rotary_tap(c, rot, interleaved);
      const volatile float a = x[c] * cs[t.freq], b = t.sign * x[t.partner] * sn[t.freq];
      const float want = a + b;
      const float got = sem::rotary_channel(
          c, rot, interleaved, [&](int ch) { return x[ch]; }, [&](int k) { return cs[k]; },
          [&](int k) { return sn[k]; });
      EXPECT_EQ(std::bit_cast<u32>(got), std::bit_cast<u32>(want)) << "channel " << c;
    }
  }
}

TEST(SemanticsRotary, TapsRealiseGptjPairsAndNeoxHalves) {
  const int rot = 8, half = rot / 2;
  for (int c = 0; c < rot; ++c) {
    const sem::RotaryTap gptj = sem::rotary_tap(c, rot, true);
    EXPECT_EQ(gptj.freq, c / 2);
    EXPECT_EQ(gptj.partner, c % 2 == 0 ? c + 1 : c - 1);
    EXPECT_EQ(gptj.sign, c % 2 == 0 ? -1.0f : 1.0f);
    const sem::RotaryTap neox = sem::rotary_tap(c, rot, false);
    EXPECT_EQ(neox.freq, c % half);
    EXPECT_EQ(neox.partner, c < half ? c + half : c - half);
    EXPECT_EQ(neox.sign, c < half ? -1.0f : 1.0f);
  }
  // Rotating by +theta then -theta is the identity for both layouts.
  std::mt19937 gen(5);
  std::normal_distribution<double> nd;
  for (bool interleaved : {true, false}) {
    std::vector<double> x(rot), y(rot), z(rot), theta(half);
    for (auto& v : x) v = nd(gen);
    for (auto& v : theta) v = nd(gen);
    for (int c = 0; c < rot; ++c) {
      const sem::RotaryTap t = sem::rotary_tap(c, rot, interleaved);
      y[c] = x[c] * std::cos(theta[t.freq]) + t.sign * x[t.partner] * std::sin(theta[t.freq]);
    }
    for (int c = 0; c < rot; ++c) {
      const sem::RotaryTap t = sem::rotary_tap(c, rot, interleaved);
      z[c] = y[c] * std::cos(theta[t.freq]) - t.sign * y[t.partner] * std::sin(theta[t.freq]);
    }
    for (int c = 0; c < rot; ++c) EXPECT_NEAR(z[c], x[c], 1e-12);
  }
}

// ---------------------------------------------------------------------------------------------
// Conversions. Oracles: the compiler's _Float16 for fp16, exact candidate comparison for bf16, and a
// brute-force nearest-code search over all 256 codes (decoded with ldexp) for the fp8 formats.

uint16_t f16_oracle(float x) {
  return std::bit_cast<uint16_t>((_Float16)x);
}

uint16_t bf16_oracle(float x) {
  const u32 u = std::bit_cast<u32>(x);
  if (std::isnan(x)) return 0;  // callers check NaN separately
  const u32 lo = u & 0xffff0000u, hi = lo + 0x10000u;
  const double dlo = std::fabs((double)std::bit_cast<float>(lo) - x);
  const double dhi = std::isinf(std::bit_cast<float>(hi)) && !std::isinf(x)
                         ? std::ldexp(1.0, 128) - std::fabs((double)x)  // the overflow neighbour is 2^128
                         : std::fabs((double)std::bit_cast<float>(hi) - x);
  if (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1u) == 0)) return (uint16_t)(lo >> 16);
  return (uint16_t)(hi >> 16);
}

struct Fp8Spec {
  num::Fp8Format fmt;
  int exp_bits, man_bits, bias;
  const char* name;
};
const Fp8Spec kFp8Specs[] = {
    {num::kE4M3, 4, 3, 7, "e4m3"}, {num::kE4M3FNUZ, 4, 3, 8, "e4m3fnuz"}, {num::kE5M2, 5, 2, 15, "e5m2"}};

/// Independent decoder: NaN for the NaN codes, +-inf for e5m2's infinities.
double fp8_decode(const Fp8Spec& s, uint8_t code) {
  const int sign = code >> 7, e = (code >> s.man_bits) & ((1 << s.exp_bits) - 1),
            m = code & ((1 << s.man_bits) - 1);
  if (s.fmt.fnuz && code == 0x80) return NAN;
  if (!s.fmt.fnuz && s.exp_bits == 4 && e == 15 && m == 7) return NAN;
  if (s.exp_bits == 5 && e == 31) return m ? NAN : (sign ? -INFINITY : INFINITY);
  const double mag = e == 0 ? std::ldexp((double)m, 1 - s.bias - s.man_bits)
                            : std::ldexp(1.0 + m / (double)(1 << s.man_bits), e - s.bias);
  return sign ? -mag : mag;
}

/// Nearest finite code, ties to the even code, saturating; negative zero only where the format has it.
uint8_t fp8_oracle(const Fp8Spec& s, float x) {
  const double v = std::clamp((double)x, -(double)s.fmt.max_finite, (double)s.fmt.max_finite);
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const double dec = fp8_decode(s, (uint8_t)c);
    if (!std::isfinite(dec)) continue;
    if (std::signbit(dec) != std::signbit(v) && dec != 0.0) continue;
    const double d = std::fabs(dec - v);
    if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) best = c, best_d = d;
  }
  const double dec = fp8_decode(s, (uint8_t)best);
  if (dec == 0.0) return (std::signbit(x) && !s.fmt.fnuz) ? 0x80 : 0x00;
  return (uint8_t)best;
}

TEST(NumericConversions, F16DecodeMatchesCompilerForEveryCode) {
  for (u32 h = 0; h < 65536; ++h) {
    const float want = (float)std::bit_cast<_Float16>((uint16_t)h);
    const float got = num::f16_to_f32((uint16_t)h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(std::bit_cast<u32>(got), std::bit_cast<u32>(want)) << std::hex << h;
    ASSERT_EQ(num::f32_to_f16(got), (uint16_t)h) << std::hex << h;  // round trip
  }
}

TEST(NumericConversions, F16EncodeTiesSaturationSubnormalsNaN) {
  // Ties to even: 1 + 2^-11 sits halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(num::f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(num::f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(num::f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(num::f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);      // tie with 0 -> 0
  EXPECT_EQ(num::f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie between 1 and 2 units -> 2
  EXPECT_EQ(num::f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(num::f32_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(num::f32_to_f16(65520.0f), 0x7c00);  // IEEE overflow to inf
  EXPECT_EQ(num::f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(num::f32_to_f16(-0.0f), 0x8000);
  const uint16_t nan_bits = num::f32_to_f16(NAN);
  EXPECT_TRUE(std::isnan(num::f16_to_f32(nan_bits)));
  // Random values across the whole float range against the compiler's conversion.
  std::mt19937 gen(1234);
  for (int n = 0; n < 200000; ++n) {
    const float x = std::bit_cast<float>((u32)gen());
    if (std::isnan(x)) continue;
    ASSERT_EQ(num::f32_to_f16(x), f16_oracle(x)) << x;
  }
  // Dense sweep of the fp16 range, where rounding decisions actually happen.
  std::uniform_real_distribution<float> ud(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> us(-1e-4f, 1e-4f);
  for (int n = 0; n < 100000; ++n) {
    const float a = ud(gen), b = us(gen);
    ASSERT_EQ(num::f32_to_f16(a), f16_oracle(a)) << a;
    ASSERT_EQ(num::f32_to_f16(b), f16_oracle(b)) << b;
  }
}

TEST(NumericConversions, Bf16RoundTripTiesOverflowNaN) {
  for (u32 h = 0; h < 65536; ++h) {
    const float f = num::bf16_to_f32((uint16_t)h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(num::bf16_to_f32(num::f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(num::f32_to_bf16(f), (uint16_t)h) << std::hex << h;
  }
  EXPECT_EQ(num::f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(num::f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(num::f32_to_bf16(std::bit_cast<float>(0x3f808001u)), 0x3f81);
  EXPECT_EQ(num::f32_to_bf16(std::bit_cast<float>(0x7f7fffffu)), 0x7f80);  // overflows to inf
  EXPECT_EQ(num::f32_to_bf16(std::bit_cast<float>(0x00008000u)), 0x0000);  // subnormal tie -> 0
  EXPECT_EQ(num::f32_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);
  EXPECT_TRUE(
      std::isnan(num::bf16_to_f32(num::f32_to_bf16(std::bit_cast<float>(0x7f800001u)))));  // sNaN stays NaN
  EXPECT_TRUE(std::isnan(num::bf16_to_f32(num::f32_to_bf16(std::bit_cast<float>(0xffc00000u)))));
  std::mt19937 gen(99);
  for (int n = 0; n < 300000; ++n) {
    const float x = std::bit_cast<float>((u32)gen());
    if (std::isnan(x)) continue;
    ASSERT_EQ(num::f32_to_bf16(x), bf16_oracle(x)) << std::hex << std::bit_cast<u32>(x);
  }
}

TEST(NumericConversions, Fp8DecodeAndRoundTripEveryCode) {
  for (const Fp8Spec& s : kFp8Specs)
    for (int c = 0; c < 256; ++c) {
      const double want = fp8_decode(s, (uint8_t)c);
      const float got = num::fp8_to_f32((uint8_t)c, s.fmt);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << s.name << " " << c;
        EXPECT_TRUE(std::isnan(num::fp8_to_f32(num::f32_to_fp8(got, s.fmt), s.fmt))) << s.name << " " << c;
        continue;
      }
      ASSERT_EQ((double)got, want) << s.name << " code " << c;
      if (std::isinf(want)) continue;
      ASSERT_EQ(num::f32_to_fp8(got, s.fmt), (uint8_t)c) << s.name << " code " << c;
    }
}

TEST(NumericConversions, Fp8EncodeMatchesNearestEvenSaturating) {
  std::mt19937 gen(4321);
  for (const Fp8Spec& s : kFp8Specs) {
    SCOPED_TRACE(s.name);
    const float max = s.fmt.max_finite;
    // Every midpoint between neighbouring finite codes (the ties) and points just off them.
    std::vector<double> values;
    for (int c = 0; c < 256; ++c) {
      const double v = fp8_decode(s, (uint8_t)c);
      if (std::isfinite(v)) values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    for (size_t n = 0; n + 1 < values.size(); ++n) {
      const float mid = (float)((values[n] + values[n + 1]) / 2);
      for (float x : {mid, std::nextafter(mid, -INFINITY), std::nextafter(mid, INFINITY)})
        ASSERT_EQ(num::f32_to_fp8(x, s.fmt), fp8_oracle(s, x)) << x;
    }
    std::uniform_real_distribution<float> ud(-1.2f * max, 1.2f * max);
    for (int n = 0; n < 20000; ++n) {
      const float x = ud(gen);
      ASSERT_EQ(num::f32_to_fp8(x, s.fmt), fp8_oracle(s, x)) << x;
      const float small = x / max * std::ldexp(1.0f, 2 - s.bias);  // the subnormal range
      ASSERT_EQ(num::f32_to_fp8(small, s.fmt), fp8_oracle(s, small)) << small;
    }
    // Saturation (cvt .satfinite): beyond the largest finite value and infinities clamp to +-max.
    EXPECT_EQ(num::fp8_to_f32(num::f32_to_fp8(1e30f, s.fmt), s.fmt), max);
    EXPECT_EQ(num::fp8_to_f32(num::f32_to_fp8(-1e30f, s.fmt), s.fmt), -max);
    EXPECT_EQ(num::fp8_to_f32(num::f32_to_fp8(INFINITY, s.fmt), s.fmt), max);
    EXPECT_EQ(num::fp8_to_f32(num::f32_to_fp8(-INFINITY, s.fmt), s.fmt), -max);
    EXPECT_TRUE(std::isnan(num::fp8_to_f32(num::f32_to_fp8(NAN, s.fmt), s.fmt)));
    // Zero: fnuz has a single zero (0x80 is its NaN), so -0 and negative underflow encode as 0x00.
    const uint8_t neg_zero = num::f32_to_fp8(-0.0f, s.fmt), neg_tiny = num::f32_to_fp8(-1e-30f, s.fmt);
    EXPECT_EQ(neg_zero, s.fmt.fnuz ? 0x00 : 0x80);
    EXPECT_EQ(neg_tiny, s.fmt.fnuz ? 0x00 : 0x80);
    EXPECT_EQ(num::fp8_to_f32(neg_tiny, s.fmt), 0.0f);
  }
}

}  // namespace
}  // namespace flashport
