// The narrow Hopper backward's fused dQ convert (FP_BWD_FUSED_CONVERT, attn_bwd_sm90.cu): per query
// block, a counter of the key blocks whose bulk reduce-adds into its fp32 accumulator tiles are performed,
// and the conversion of a finished block to dq in the input dtype by producer warp 3, the same values as
// attn_bwd_dq_convert (attn_bwd_aux.cu) writes. A query block no key block sees gets no arrival and is
// never converted: its rows see no key, and the D kernel wrote them as zeros before (BwdParams::
// zero_dq_rows). Dense or varlen, any window; not deterministic; 16-byte aligned dq rows
// (hopper_bwd::fused_convert_fits).
//
// Memory ordering. The reduce-adds are async-proxy writes issued by one thread (thread 64, the drain). Its
// `cp.async.bulk.wait_group` (not .read) returns once they are complete; `fence.proxy.async.global` then
// orders them before the thread's later generic-proxy operations, of which the first is the counter's
// `atom.release.gpu` (the same sequence as deterministic mode's pass_dq_turn before its release). The drain
// whose arrival completes the count hands the block to warp 3 through shared memory and a named barrier
// (CTA scope: it carries the block's coordinates, not the data's ordering). Each lane of warp 3 then reads
// the counter with `ld.acquire.gpu`: that load reads the last value of the counter's chain of atomic adds, so
// every arrival's release (this CTA's and the other key blocks') precedes it in observation order and
// synchronises with it, and the lane's later loads of the tiles see every key block's additions (the
// acquire also keeps them from being served by stale L1 lines). No lane reads the tiles before its own
// acquire.
#pragma once

#include "cuda/hopper/bwd_sm90_common.cuh"

namespace flashport::cuda::hopper_bwd {

/// Adds one arrival to `counter` with release semantics at GPU scope; returns the count before it.
FP_DEV int arrive_dq_block(int* counter) {
  return sm90::atom_release_gpu_inc(counter);
}

/// The parameters through an opaque pointer: what is computed from it stays where it is used instead of
/// being hoisted out of the caller's step loop and kept live in the producers' registers (it spilled).
FP_DEV const BwdParams* opaque_params(const BwdParams& prm) {
  const BwdParams* q = &prm;
  asm volatile("" : "+l"(q));
  return q;
}

/// How many key blocks add into query block m0 (kBlockM = 64 queries, one accumulator tile) of sequence
/// seq: those holding a key of the block's tile_keys (exact: a key block holds one iff some row of the
/// block sees one of its keys, which is when make_work's seeing_query_blocks gives it the block). Only
/// asked for blocks some key block sees (hi > lo).
FP_DEV int dq_block_arrivals(const AttnProblem& p, const bwd::Seq& seq, int m0) {
  const sem::KeyRange kr = sem::tile_keys(m0, min_int(m0 + kBlockM, seq.len_q), seq.len_q, seq.len_k,
                                          p.window_left, p.window_right);
  return (int)((kr.hi - 1) / kBlockN - kr.lo / kBlockN) + 1;
}

/// A finished query block (query head h, first row m0), posted by the drain thread to the converter warp
/// through shared memory (SharedStorage::convert); h < 0: no more blocks, the converter returns.
struct ConvertRequest {
  int h, m0;
};

/// `rows` dq rows from their finished fp32 accumulator tiles at g_tiles (consecutive 64 x d tiles in
/// bwd::accum_tile_offset's order) into g_dq (row pitch row_stride elements), by the 32 lanes of one warp:
/// dq = scale * accumulator in the input dtype, rounded as attn_bwd_dq_convert rounds it (it adds its one
/// slice to 0.0f first, which changes no value: an accumulator that starts at +0 and only takes
/// round-to-nearest additions is never -0). Lane (L, rl) = (lane / 8, lane % 8) takes rows rl, rl + 8, ...
/// and in each the 8-column chunks L + 4k: a chunk is 8 consecutive floats of the tile, chunk L + 4k lies
/// 2048k floats past chunk L, and the 8 lanes of one L read 256 contiguous bytes. Each half chunk is one
/// 16-byte load and one 8-byte store: whole chunks (two loads, a 16-byte store) spilled 8 bytes at d 64
/// (fp16, ALiBi).
template <class E>
FP_DEV void convert_dq_block(const float* g_tiles, void* g_dq, int rows, i64 row_stride, float scale,
                             int lane) {
  using S = typename E::Storage;
  const int chunk = lane >> 3;
#pragma unroll 1
  for (int r = lane & 7; r < rows; r += 8) {  // rows past the sequence stay unwritten
    const float* a = g_tiles + (r >> 6) * 64 * kHeadDim + bwd::accum_tile_offset(r & 63, 8 * chunk, 64);
    S* d = static_cast<S*>(g_dq) + r * row_stride + 8 * chunk;
#pragma unroll
    for (int k = 0; k < kHeadDim / 32; ++k) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const U32x4 v = ld_global_16(a + 2048 * k + 4 * half);
        const u32 lo = E::pack(u32_as_float(v.x) * scale, u32_as_float(v.y) * scale);
        const u32 hi = E::pack(u32_as_float(v.z) * scale, u32_as_float(v.w) * scale);
        sm90::st_global_u32x2(d + 32 * k + 4 * half, lo, hi);
      }
    }
  }
}

}  // namespace flashport::cuda::hopper_bwd
