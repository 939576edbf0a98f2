// Which CUDA forward family a call takes (family.cpp's choose), host only: problems whose fake, aligned
// pointers are never read, for decisions that need no device query.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "backends/cuda/family.hpp"
#include "backends/cuda/sm80/forward.hpp"
#include "core/problem.h"

namespace flashport::cuda {
namespace {

/// Dense bf16 (batch, s, heads, 128) operands the Hopper forward supports (16-byte aligned, contiguous).
AttnProblem problem(long long batch, long long sq, long long sk, long long hq, long long hk) {
  AttnProblem p{};
  p.batch = batch, p.hq = hq, p.hk = hk, p.d = p.dv = 128, p.sq = sq, p.sk = sk;
  p.in_type = p.out_type = kBF16;
  void* aligned = reinterpret_cast<void*>(uintptr_t{1} << 20);
  p.q = {aligned, sq * hq * p.d, hq * p.d, p.d};
  p.k = {aligned, sk * hk * p.d, hk * p.d, p.d};
  p.v = p.k;
  p.o = p.q;
  p.scale = 0.1f;
  p.window_left = p.window_right = -1;
  return p;
}

const char* forward_family(const AttnProblem& p) {
  return choose(forward_families(), p, 90, "").name;
}

// Decode-sized calls (query rows, GQA heads packed in, <= 16) are the portable decode variant's at any
// batch: the Hopper forward took those whose (batch x heads) tiles filled the GPU, one or a few real rows
// per 128-row tile and no split-KV, at a third of the variant's rate (docs/PERF.md, "Decode back on its
// kernel"). A prefill chunk's choice needs the SM count (a device query), so only the declines are here.
TEST(FamilyChoice, DecodeSizedCallsTakeThePortableDecodeVariant) {
  for (long long batch : {1, 8, 128, 1024}) {
    EXPECT_STREQ(forward_family(problem(batch, 1, 8192, 32, 8)), "portable")
        << "one token, GQA 4, b " << batch;
    EXPECT_STREQ(forward_family(problem(batch, 2, 4096, 64, 8)), "portable")
        << "two tokens, GQA 8, b " << batch;
    EXPECT_STREQ(forward_family(problem(batch, 16, 4096, 16, 16)), "portable")
        << "16 queries of MHA, b " << batch;
  }
  EXPECT_TRUE(decode_sized(problem(4, 4, 100, 16, 4)));
  EXPECT_FALSE(decode_sized(problem(4, 5, 100, 16, 4)));  // 20 rows per kv head
  EXPECT_FALSE(decode_sized(problem(4, 17, 100, 8, 8)));
}

}  // namespace
}  // namespace flashport::cuda
