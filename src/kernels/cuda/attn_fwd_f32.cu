// The fp32 forward (fp32 inputs and output on CUDA, sm80+): exact fp32 arithmetic on the CUDA cores, no
// tensor cores (TF32 would round the inputs to 10 mantissa bits, far outside SPEC's rule against an fp32
// baseline). FlashAttention-2's loop: per key tile, scores, online softmax, P V; the score transform,
// masks, dropout and the softmax's row conventions are core/'s policies, as in every other forward.
//
// Compile-time head-dim bucket -D FP_HEADDIM (64, 128, 256: the real d and dv are <= it, multiples of 8
// per the host). A row of the block is served by kLanes adjacent lanes; lane l holds channels
// [4 (l + kLanes t), +4) of q and of the output (t < kVecs), so a K/V row in shared memory is read
// with 16-byte loads that every row of the warp shares (broadcast). Each lane computes its partial
// dot products, a butterfly over the row's lanes completes them, so every lane of a row holds the
// same scores, softmax state and probabilities; none of that needs another reduction.
#include "cuda/attn_fwd_params.cuh"
#include "cuda/common/common.cuh"

#ifndef FP_HEADDIM
#error "attn_fwd_f32 needs -D FP_HEADDIM"
#endif

namespace flashport::cuda::fwd32 {

constexpr int kHeadDim = FP_HEADDIM;
constexpr int kLanes = kHeadDim <= 128 ? 4 : 8;  // lanes per row: <= 32 channels each (registers)
constexpr int kVecs = kHeadDim / (4 * kLanes);   // float4 chunks per lane
constexpr int kThreads = 128;
constexpr int kRows = kThreads / kLanes;             // query rows per block
constexpr int kBlockN = 32;                          // keys per tile: kBlockN scores per lane in registers
constexpr int kSmemFloats = 2 * kBlockN * kHeadDim;  // K then V tile, rows of kHeadDim floats
constexpr int kSmemBytes = kSmemFloats * 4;
static_assert(kHeadDim % (4 * kLanes) == 0 && kLanes <= 32 && 32 % kLanes == 0, "bad bucket");
static_assert(kBlockN <= 32, "dropout keep bits in one 32-bit word");
static_assert(2 * kBlockN <= kThreads, "one thread per K and V row offset");

struct float4_ {
  float x, y, z, w;
};

/// Copies a tile of kBlockN key rows of one operand (d channels) into s_tile as fp32 rows of kHeadDim;
/// row r starts at element s_off[r] of g, and rows with s_off[r] < 0 (past the sequence, out-of-range
/// cache rows) and channels >= d are zeros. `vec`: every row is 16-byte aligned (pointer and strides
/// multiples of 4 floats).
FP_DEV void load_keys(float* s_tile, const float* g, i64 d, bool vec, const i64* s_off) {
  constexpr int kChunks = kHeadDim / 4;
  for (int c = threadIdx.x; c < kBlockN * kChunks; c += kThreads) {
    const int r = c / kChunks, ch = c % kChunks;
    const i64 off = s_off[r];
    float4_ v{0.0f, 0.0f, 0.0f, 0.0f};
    if (off >= 0 && ch * 4 < d) {
      const float* src = g + off + ch * 4;
      if (vec) {
        v = *reinterpret_cast<const float4_*>(src);
      } else {
        v.x = src[0], v.y = src[1], v.z = src[2], v.w = src[3];  // d is a multiple of 8
      }
    }
    *reinterpret_cast<float4_*>(s_tile + r * kHeadDim + ch * 4) = v;
  }
}

/// Sum over the kLanes lanes of a row (adjacent lanes, aligned groups).
FP_DEV float row_sum(float v) {
#pragma unroll
  for (int m = 1; m < kLanes; m <<= 1) v += shfl_xor(v, m);
  return v;
}

}  // namespace flashport::cuda::fwd32

using namespace flashport;
using namespace flashport::cuda;
using namespace flashport::cuda::fwd32;

/// Grid: x = query blocks of kRows (reversed: causal blocks with the most keys start first), y = query
/// heads, z = sequences (from batch_offset). Block: kThreads. Dynamic smem: kSmemBytes. Splits and GQA
/// packing are not used (the host passes num_splits 1, pack_gqa 1).
extern "C" __global__ void __launch_bounds__(kThreads, 1)
    attn_fwd_f32(const __grid_constant__ FwdParams prm) {
  order_after_prior_grids();
  const AttnProblem& p = prm.p;
  float* s_k = dynamic_smem<float>();
  float* s_v = s_k + kBlockN * kHeadDim;
  __shared__ i64 s_row_off[2 * kBlockN];  // this tile's K row offsets, then V's

  const i64 b = prm.batch_offset + block_z(), h = block_y(), hk = kv_head(p, h);
  const SeqLens seq = guarded_lengths(p, b);
  const i64 m0 = ((i64)gridDim.x - 1 - block_x()) * kRows;
  if (m0 >= seq.q) return;  // whole block: no barrier reached yet
  const int lane_in_row = threadIdx.x % kLanes;
  const i64 i = m0 + threadIdx.x / kLanes;  // this thread's query row
  const bool live = i < seq.q;              // padding rows compute along (barriers) but store nothing
  const i64 last = (m0 + kRows < seq.q ? m0 + kRows : seq.q) - 1;

  // q (this lane's channels, zero past d); the score transform applies the scale.
  float4_ q[kVecs];
  const float* g_q = static_cast<const float*>(p.q.ptr);
  const i64 q_off = live ? q_offset(p, p.q, b, i, h) : 0;
#pragma unroll
  for (int t = 0; t < kVecs; ++t) {
    const int c = 4 * (lane_in_row + kLanes * t);
    q[t] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live && c < p.d) q[t] = {g_q[q_off + c], g_q[q_off + c + 1], g_q[q_off + c + 2], g_q[q_off + c + 3]};
  }
  float4_ o[kVecs];
#pragma unroll
  for (int t = 0; t < kVecs; ++t) o[t] = {0.0f, 0.0f, 0.0f, 0.0f};
  float m = sem::kNegInf, l = 0.0f;

  const float scale = p.scale, slope = alibi_slope(p, b, h);
  const sem::KeyRange mine = sem::visible_keys(i, seq.q, seq.k, p.window_left, p.window_right);
  const sem::KeyRange keys = sem::tile_keys(m0, last + 1, seq.q, seq.k, p.window_left, p.window_right);
  const sem::Tiles<i64> tiles = sem::covering_tiles<i64>(keys.lo, keys.hi, kBlockN);
  const bool vec_k = prm.vec & kVecK, vec_v = prm.vec & kVecV;
  const float* g_k = static_cast<const float*>(p.k.ptr);
  const float* g_v = static_cast<const float*>(p.v.ptr);

  for (i64 tile = tiles.begin; tile < tiles.end; ++tile) {
    const i64 j0 = tile * kBlockN;
    __syncthreads();  // the previous tile (and its row offsets) has been read
    // Each key row's K and V offsets once (a paged row reads the block table here), not once per chunk.
    if (threadIdx.x < 2 * kBlockN) {
      const int r = threadIdx.x % kBlockN;
      const Operand& t = threadIdx.x < kBlockN ? p.k : p.v;
      s_row_off[threadIdx.x] = j0 + r < seq.k ? k_offset(p, t, b, j0 + r, hk) : (i64)-1;
    }
    __syncthreads();
    load_keys(s_k, g_k, p.d, vec_k, s_row_off);
    load_keys(s_v, g_v, p.dv, vec_v, s_row_off + kBlockN);
    __syncthreads();

    // Scores in log2 units, -inf outside this row's visible keys.
    float s[kBlockN];
    float tile_max = sem::kNegInf;
#pragma unroll
    for (int n = 0; n < kBlockN; ++n) {
      const float* k_row = s_k + n * kHeadDim;
      float dot = 0.0f;
#pragma unroll
      for (int t = 0; t < kVecs; ++t) {
        const float4_ kv = *reinterpret_cast<const float4_*>(k_row + 4 * (lane_in_row + kLanes * t));
        dot = fmaf(q[t].x, kv.x, dot);
        dot = fmaf(q[t].y, kv.y, dot);
        dot = fmaf(q[t].z, kv.z, dot);
        dot = fmaf(q[t].w, kv.w, dot);
      }
      dot = row_sum(dot);
      const i64 j = j0 + n;
      const bool visible = j >= mine.lo && j < mine.hi && j < seq.k;
      s[n] = visible ? score<float>(p, dot, scale, slope, i, j, seq.q, seq.k) * kLog2e : sem::kNegInf;
      tile_max = fmaxf(tile_max, s[n]);
    }

    // Online softmax: rescale O and l to the new max, P = 2^(s - base) (sem's row conventions).
    const float m_new = fmaxf(m, tile_max);
    const float base = sem::softmax_base(m_new);
    const float alpha = exp2f(m - base);
    m = m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kBlockN; ++n) {
      s[n] = exp2f(s[n] - base);
      sum += s[n];
    }
    l = l * alpha + sum;
    if (p.dropout_p > 0.0f) {  // after the row sum: the LSE is taken before dropout
      // Keep bits first in a rolled loop (one Philox body), then applied unrolled: s stays in registers.
      unsigned keep = 0;
#pragma unroll 1
      for (int n = 0; n < kBlockN; ++n)
        keep |= (unsigned)sem::dropout_keep(p.seed, p.offset, p.dropout_threshold, i, j0 + n, b, p.hq, h)
                << n;
#pragma unroll
      for (int n = 0; n < kBlockN; ++n)
        if (!((keep >> n) & 1u)) s[n] = 0.0f;
    }

    // O = alpha O + P V.
#pragma unroll
    for (int t = 0; t < kVecs; ++t) o[t] = {o[t].x * alpha, o[t].y * alpha, o[t].z * alpha, o[t].w * alpha};
#pragma unroll
    for (int n = 0; n < kBlockN; ++n) {
      const float* v_row = s_v + n * kHeadDim;
#pragma unroll
      for (int t = 0; t < kVecs; ++t) {
        const float4_ vv = *reinterpret_cast<const float4_*>(v_row + 4 * (lane_in_row + kLanes * t));
        o[t].x = fmaf(s[n], vv.x, o[t].x);
        o[t].y = fmaf(s[n], vv.y, o[t].y);
        o[t].z = fmaf(s[n], vv.z, o[t].z);
        o[t].w = fmaf(s[n], vv.w, o[t].w);
      }
    }
  }

  if (!live) return;  // no barrier follows
  // O / l (times dropout's 1 / (1 - p)); a row without visible keys stores 0 and LSE -inf.
  const float keep_scale = sem::dropout_keep_scale(p.dropout_p);
  const float fac = keep_scale * sem::softmax_norm(l);
  float* g_o = static_cast<float*>(p.o.ptr);
  const i64 o_off = q_offset(p, p.o, b, i, h);
#pragma unroll
  for (int t = 0; t < kVecs; ++t) {
    const int c = 4 * (lane_in_row + kLanes * t);
    if (c >= p.dv) continue;
    g_o[o_off + c] = o[t].x * fac, g_o[o_off + c + 1] = o[t].y * fac;
    g_o[o_off + c + 2] = o[t].z * fac, g_o[o_off + c + 3] = o[t].w * fac;
  }
  if (p.lse && lane_in_row == 0)
    p.lse[lse_offset(p, b, h, i)] = sem::softmax_lse(m, l, [](float x) { return log2f(x); });
}
