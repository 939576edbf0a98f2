// The CDNA forward kernel on the CPU wave64 model against the CPU reference (SPEC's accuracy rule):
// awkward shapes, every mask and score variant, GQA, varlen with empty sequences, seqused_k, paged KV.
// Outputs and LSE are poisoned with NaN first.
#include <gtest/gtest.h>

#include "hip_model_check.hpp"

namespace flashport::test {
namespace {

using hipmodel::check;

TEST(HipModelForward, SeqlenOne) {
  check(dense(DType::bf16, 2, 1, 1, 2, 1, 64, 64));
  Case c = dense(DType::f16, 1, 1, 37, 3, 3, 128, 128);
  c.causal = true;
  check(c);
}

TEST(HipModelForward, OddLengthsBothDtypes) {
  for (DType dt : {DType::bf16, DType::f16}) {
    check(dense(dt, 1, 113, 203, 2, 2, 64, 64));
    Case c = dense(dt, 1, 113, 203, 2, 1, 128, 128);
    c.causal = true;
    check(c);
  }
}

TEST(HipModelForward, QueriesLongerThanKeys) {
  Case c = dense(DType::bf16, 2, 77, 20, 2, 2, 64, 64);
  c.causal = true;  // bottom-right: the first 57 rows see nothing (output 0, LSE -inf)
  check(c);
  c.causal = false;
  check(c);
}

TEST(HipModelForward, Gqa7To1) {
  Case c = dense(DType::bf16, 1, 33, 70, 7, 1, 64, 64);
  check(c);
  c.wl = 9, c.wr = 3;
  check(c);
}

/// GQA packing (FwdParams::pack_gqa): the group's query heads interleaved in a block's rows, forced on
/// and off: decode (1 query), a block boundary inside a query's heads (5 x 7 rows; 33 x 7 over four
/// 64-row blocks), causal with more queries than keys, a window, per-head ALiBi slopes and softcap,
/// dropout (its counter takes each row's own head), varlen and a paged cache.
TEST(HipModelForward, GqaPacking) {
  for (int pack : {1, 4}) {
    check(dense(DType::bf16, 2, 1, 300, 8, 2, 128, 128), true, pack);
    Case c = dense(DType::f16, 1, 3, 2, 8, 2, 64, 64);
    c.causal = true;
    check(c, true, pack);
  }
  for (int pack : {1, 7}) {
    check(dense(DType::bf16, 1, 5, 70, 7, 1, 64, 64), true, pack);
    Case c = dense(DType::bf16, 2, 33, 90, 7, 1, 64, 64);
    c.alibi = 2, c.softcap = 5.0, c.q_stddev = 3.0, c.wl = 20, c.wr = 0;
    check(c, true, pack);
    c.softcap = 0.0, c.alibi = 0, c.wl = -1, c.wr = -1, c.q_stddev = 1.0, c.dropout = 0.25;
    check(c, true, pack);
  }
  check(varlen(dense(DType::bf16, 1, 1, 1, 6, 2, 64, 64), {1, 0, 3}, {40, 7, 0}), true, 3);
  check(paged(dense(DType::bf16, 2, 2, 0, 4, 1, 128, 128), 16, {100, 33}), true, 4);
}

TEST(HipModelForward, PaddedHeadDims) {
  check(dense(DType::bf16, 1, 40, 50, 2, 2, 72, 72));    // bucket 96
  check(dense(DType::f16, 1, 40, 50, 1, 1, 40, 40));     // bucket 64
  check(dense(DType::bf16, 1, 21, 35, 1, 1, 152, 152));  // bucket 160: 32-key tiles
  check(dense(DType::bf16, 1, 20, 70, 1, 1, 256, 256));
  check(dense(DType::f16, 1, 17, 29, 1, 1, 32, 32));
}

TEST(HipModelForward, ScoreVariants) {
  Case c = dense(DType::bf16, 2, 50, 90, 2, 1, 64, 64);
  c.softcap = 5.0, c.q_stddev = 3.0;
  check(c);
  c.softcap = 0.0, c.q_stddev = 1.0;
  c.alibi = 1, c.causal = true;
  check(c);
  c.alibi = 2, c.causal = false, c.wl = 20, c.wr = 0;
  check(c);
}

TEST(HipModelForward, VarlenWithEmptySequencesAndSequsedK) {
  Case c;
  c.dtype = DType::bf16, c.layout = Layout::varlen, c.hq = 2, c.hk = 1, c.d = c.dv = 64;
  c.q_lens = {0, 70, 1, 33}, c.k_lens = {5, 0, 40, 90};
  check(c);
  c.causal = true;
  check(c);
  c.used_k = {3, 0, 17, 90};
  check(c);
}

TEST(HipModelForward, PagedKv) {
  Case c;
  c.dtype = DType::f16, c.layout = Layout::paged, c.hq = 4, c.hk = 2, c.d = c.dv = 64;
  c.q_lens = {9, 9}, c.k_lens = {100, 100}, c.page = 16, c.causal = true;
  check(c);
  c.page = 7, c.used_k = {30, 100};
  check(c);
}

TEST(HipModelForward, UnalignedRowsTakeTheScalarPath) {
  check(dense(DType::bf16, 1, 30, 45, 1, 1, 64, 64), /*vec=*/false);
}

}  // namespace
}  // namespace flashport::test
