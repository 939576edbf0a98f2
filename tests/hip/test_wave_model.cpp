// The CPU wave64 model against plain arithmetic: MFMA 16x16x16 (bf16, fp16) against a matrix product
// for random inputs, the documented lane maps at spot positions, shuffles, barriers, LDS and atomics.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/test_util.hpp"
#include "wave/wave.hpp"

namespace flashport::wave {
namespace {

// Spot values read off the AMD Matrix Instruction Calculator's register-layout tables for
// v_mfma_f32_16x16x16_bf16 (cdna3) / v_mfma_f32_16x16x16bf16_1k (cdna2): A[0][4] is v0{16}.[15:0]
// (lane 16, element 0), A[3][13] is v1{51}.[15:0] (lane 51, element 1*2+0), B[6][9] is v1{25}.[15:0]
// (lane 25, element 2), D[5][3] is v1{19} (lane 19, register 1), D[15][15] is v3{63}.
TEST(WaveModel, MfmaLayoutMatchesCalculatorSpots) {
  EXPECT_EQ(layout16::a_lane(0, 4), 16);
  EXPECT_EQ(layout16::a_lane(3, 13), 51);
  EXPECT_EQ(13 % 4, 1);
  EXPECT_EQ(layout16::b_lane(6, 9), 25);
  EXPECT_EQ(layout16::cd_lane(5, 3), 19);
  EXPECT_EQ(layout16::cd_elem(19, 1).row, 5);
  EXPECT_EQ(layout16::cd_elem(19, 1).col, 3);
  EXPECT_EQ(layout16::cd_lane(15, 15), 63);
  // The maps are bijections onto the 16 x 16 matrices, and the inverses agree with them.
  std::vector<int> seen_a(256, 0), seen_b(256, 0), seen_d(256, 0);
  for (int lane = 0; lane < 64; ++lane)
    for (int e = 0; e < 4; ++e) {
      const layout16::Coord a = layout16::a_elem(lane, e), b = layout16::b_elem(lane, e),
                            d = layout16::cd_elem(lane, e);
      ++seen_a[a.row * 16 + a.col], ++seen_b[b.row * 16 + b.col], ++seen_d[d.row * 16 + d.col];
      EXPECT_EQ(layout16::a_lane(a.row, a.col), lane);
      EXPECT_EQ(a.col % 4, e);
      EXPECT_EQ(layout16::b_lane(b.row, b.col), lane);
      EXPECT_EQ(b.row % 4, e);
      EXPECT_EQ(layout16::cd_lane(d.row, d.col), lane);
      EXPECT_EQ(d.row % 4, e);
    }
  for (int i = 0; i < 256; ++i) EXPECT_TRUE(seen_a[i] == 1 && seen_b[i] == 1 && seen_d[i] == 1) << i;
}

template <class Elem>
void check_mfma(DType dtype) {
  auto& rng = test::rng();
  std::normal_distribution<double> nd(0.0, 1.0);
  test::HostTensor a = test::randn(dtype, {16, 16}), b = test::randn(dtype, {16, 16});
  std::vector<float> c(256), d(256, NAN);
  for (float& x : c) x = (float)nd(rng);
  const u16* a_bits = reinterpret_cast<const u16*>(a.bytes.data());
  const u16* b_bits = reinterpret_cast<const u16*>(b.bytes.data());
  model::launch({1, 1, 1}, 64, 0, [&](unsigned char*) {
    const int lane = lane_id();
    u16x4 fa, fb;
    f32x4 fc;
    for (int e = 0; e < 4; ++e) {
      const layout16::Coord ca = layout16::a_elem(lane, e), cb = layout16::b_elem(lane, e),
                            cc = layout16::cd_elem(lane, e);
      fa[e] = a_bits[ca.row * 16 + ca.col];
      fb[e] = b_bits[cb.row * 16 + cb.col];
      fc[e] = c[(size_t)(cc.row * 16 + cc.col)];
    }
    const f32x4 fd = mfma16(Elem{}, fa, fb, fc);
    for (int r = 0; r < 4; ++r) {
      const layout16::Coord cd = layout16::cd_elem(lane, r);
      d[(size_t)(cd.row * 16 + cd.col)] = fd[r];
    }
  });
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      double want = c[(size_t)(i * 16 + j)], mag = std::fabs(want);
      for (int k = 0; k < 16; ++k) {
        want += a.get(i * 16 + k) * b.get(k * 16 + j);
        mag += std::fabs(a.get(i * 16 + k) * b.get(k * 16 + j));
      }
      EXPECT_NEAR(d[(size_t)(i * 16 + j)], want, 1e-6 * mag + 1e-7) << "D[" << i << "][" << j << "]";
    }
}

TEST(WaveModel, MfmaBf16IsAMatrixProduct) {
  for (int rep = 0; rep < 4; ++rep) check_mfma<bf16>(DType::bf16);
}
TEST(WaveModel, MfmaF16IsAMatrixProduct) {
  for (int rep = 0; rep < 4; ++rep) check_mfma<f16>(DType::f16);
}

TEST(WaveModel, ShflXorFollowsHipWidthRule) {
  std::vector<float> got(128 * 3, NAN);
  model::launch({1, 1, 1}, 128, 0, [&](unsigned char*) {
    const int t = thread_id();
    got[(size_t)t] = shfl_xor((float)t, 5, 64);
    // Leaves the 16-lane segment. HIP's guard is one-sided (index >= segment end), so lanes with bit 4
    // clear read their own value and lanes with bit 4 set still read lane ^ 16: the model keeps that.
    got[(size_t)(128 + t)] = shfl_xor((float)t, 16, 16);
    got[(size_t)(256 + t)] = max_over<16, 32>((float)(t % 64));
  });
  for (int t = 0; t < 128; ++t) {
    EXPECT_EQ(got[(size_t)t], (float)(t ^ 5));
    EXPECT_EQ(got[(size_t)(128 + t)], (float)((t & 16) ? t ^ 16 : t));
    EXPECT_EQ(got[(size_t)(256 + t)], (float)(48 + t % 16));
  }
}

// wave_all is an AND over the caller's 64 lanes only: wave 0 has one lane voting false (a different
// one per round), wave 1 none.
TEST(WaveModel, WaveAllIsTheWavesAnd) {
  for (int odd : {0, 17, 63}) {
    std::vector<int> got(128, -1);
    model::launch({1, 1, 1}, 128, 0, [&](unsigned char*) {
      const int t = thread_id();
      got[(size_t)t] = wave_all(t != odd) ? 1 : 0;
    });
    for (int t = 0; t < 128; ++t)
      EXPECT_EQ(got[(size_t)t], t < 64 ? 0 : 1) << "lane " << t << ", odd " << odd;
  }
}

TEST(WaveModel, BarrierOrdersLdsAcrossWaves) {
  std::vector<int> got(256, -1);
  model::launch({2, 1, 1}, 256, 256 * 4, [&](unsigned char* lds) {
    int* s = reinterpret_cast<int*>(lds);
    const int t = thread_id();
    s[t] = t * 3 + (int)block_x();
    block_sync();
    if (block_x() == 1) got[(size_t)t] = s[255 - t];
  });
  for (int t = 0; t < 256; ++t) EXPECT_EQ(got[(size_t)t], (255 - t) * 3 + 1);
}

// atomic_add_f32 from every lane of several blocks, with a barrier between two rounds of adds: each
// lane's add lands once (small integers, so the sum is exact in any order).
TEST(WaveModel, AtomicAddSumsEveryLane) {
  float total[2] = {0.0f, 0.0f};
  model::launch({3, 1, 1}, 128, 0, [&](unsigned char*) {
    atomic_add_f32(&total[0], 1.0f);
    block_sync();
    atomic_add_f32(&total[thread_id() & 1], (float)thread_id());
  });
  EXPECT_EQ(total[0], 3.0f * (128 + 64 * 63));  // 128 ones and the even ids 0..126 per block
  EXPECT_EQ(total[1], 3.0f * 64 * 64);          // the odd ids 1..127 per block
}

}  // namespace
}  // namespace flashport::wave
