// V^T for the FP8 Hopper forward: wgmma reads e4m3 operands K-major only, so before the forward this pass
// writes V (keys x head dim, any strides, varlen through cu_seqlens_k) as (batch, kv head, head dim, keys)
// with the keys of every 32-key step in fp8_key_of_slot's order (fwd_sm90_config.h), which lets the
// forward feed its probabilities to P V without exchanging bytes between lanes. Stream-ordered before the
// forward; reads V once and writes it once, in 16-byte accesses where V's rows allow.
#include "core/problem.h"
#include "cuda/common/common.cuh"
#include "cuda/hopper/fwd_sm90_config.h"

namespace {
using namespace flashport;
using namespace flashport::cuda;
using namespace flashport::cuda::hopper;

constexpr int kThreads = 256;
constexpr int kMaxDv = 256;
constexpr int kChunk = 16;  // bytes per staged load: one 128-bit access
/// Per thread, every load of the CTA's keys issued before the first is used (the pass is bound by how many
/// bytes are in flight: one 4-byte load per lane at a time ran it at a third of the copy rate).
constexpr int kMaxChunksPerThread = kFp8VtKeys * (kMaxDv / kChunk) / kThreads;
/// Output slots per 16-byte store, and the staged rows behind them.
constexpr int kSlotRun = 16;
/// Bytes after every kSlotRun staged rows: the 32 lanes of a transpose read take rows 16 apart (4 slot
/// runs) and 8 adjacent words; with the pitch a multiple of 8 words, 16 rows cost 0 mod 32 banks, so this
/// 8-word shift per run puts the 4 runs on distinct bank octets.
constexpr int kRunPad = 32;

/// The CTA's staged keys (rows of `pitch` bytes, staged_row), aligned for 16-byte stores.
struct alignas(16) Staged {
  u8 bytes[kFp8VtKeys * kMaxDv + kFp8VtKeys / kSlotRun * kRunPad];
};

FP_DEV int staged_row(int row, int pitch) {
  return row * pitch + row / kSlotRun * kRunPad;
}

/// `n` (1..16) bytes of a V row at `src`: one 128-bit load when whole and aligned, else bytes; zeros after.
FP_DEV U32x4 load_chunk(const u8* src, int n) {
  if (n >= kChunk && aligned16(src)) return ld_global_16(src);
  u32 w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    w[k] = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (4 * k + i < n) w[k] |= (u32)src[4 * k + i] << (8 * i);
  }
  return U32x4{w[0], w[1], w[2], w[3]};
}

/// 4 x 4 byte transpose: out[c] byte i = in[i] byte c (in: 4 keys x 4 columns, out: 4 columns x 4 keys).
FP_DEV void transpose_bytes(const u32* in, u32* out) {
  const u32 lo01 = byte_perm(in[0], in[1], 0x5140), hi01 = byte_perm(in[0], in[1], 0x7362);
  const u32 lo23 = byte_perm(in[2], in[3], 0x5140), hi23 = byte_perm(in[2], in[3], 0x7362);
  out[0] = byte_perm(lo01, lo23, 0x5410), out[1] = byte_perm(lo01, lo23, 0x7632);
  out[2] = byte_perm(hi01, hi23, 0x5410), out[3] = byte_perm(hi01, hi23, 0x7632);
}
}  // namespace

/// Grid (sk rounded up / kFp8VtKeys, hk, batch), kThreads threads. Stage the CTA's kFp8VtKeys keys (zero
/// past the sequence's guarded length, problem.h) in 16-byte chunks, then let each thread write 16 slots of
/// 4 head-dim columns: 16 staged words (4 columns of one key each), byte-transposed into four 16-byte
/// stores at the sequence's slots (fp8_vt_start). CTAs past the sequence's rounded-up length write nothing
/// (varlen: those slots are the next sequence's).
extern "C" __global__ void __launch_bounds__(kThreads)
    flashport_fp8_v_transpose(const __grid_constant__ flashport::cuda::hopper::Fp8VtParams prm) {
  order_after_prior_grids();
  __shared__ Staged staged_keys;
  u8* tile = staged_keys.bytes;
  const AttnProblem& p = prm.p;
  const int hk = (int)blockIdx.y, b = (int)blockIdx.z, dv = (int)p.dv;
  const i64 key0 = (i64)blockIdx.x * kFp8VtKeys;
  const i64 len = guarded_lengths(p, b).k;
  if (key0 >= len) return;
  const u8* v = static_cast<const u8*>(p.v.ptr);
  const int pitch = (dv + kChunk - 1) / kChunk * kChunk;  // staged row bytes: whole chunks
  const int row_chunks = pitch / kChunk, chunks = kFp8VtKeys * row_chunks;
  const int tid = (int)threadIdx.x;
  U32x4 staged[kMaxChunksPerThread];
#pragma unroll
  for (int i = 0; i < kMaxChunksPerThread; ++i) {
    const int idx = tid + i * kThreads, r = idx / row_chunks, c = idx % row_chunks * kChunk;
    const i64 j = key0 + r;
    const i64 off = idx < chunks && j < len ? k_offset(p, p.v, b, j, hk) : -1;
    staged[i] = off >= 0 ? load_chunk(v + off + c, dv - c) : U32x4{0, 0, 0, 0};
  }
#pragma unroll
  for (int i = 0; i < kMaxChunksPerThread; ++i) {
    const int idx = tid + i * kThreads, r = idx / row_chunks, c = idx % row_chunks * kChunk;
    if (idx < chunks) *reinterpret_cast<U32x4*>(&tile[staged_row(r, pitch) + c]) = staged[i];
  }
  __syncthreads();

  // Unit u: column group cg (4 columns: one staged word) and slot run g. Lanes take 8 column groups x 4
  // runs, so a warp's store covers 8 columns x 64 contiguous bytes and its staged reads hit 32 banks.
  const int col_groups = (dv + 3) / 4;
  const int units = 64 * ((col_groups + 7) / 8);
  const i64 slab = p.cu_seqlens_k ? 0 : b;  // varlen: one slab, sequences at their start slots
  u8* vt = prm.vt + (slab * p.hk + hk) * dv * prm.keys + fp8_vt_start(p, b) + key0;
  for (int u = tid; u < units; u += kThreads) {
    const int cg = u % 8 + 8 * (u / 64), g = u / 8 % 4 + 4 * (u / 32 % 2);
    if (cg >= col_groups) continue;
    u32 keys_by_col[kSlotRun];  // word i: columns 4cg..4cg+3 of the key in slot g * 16 + i
#pragma unroll
    for (int i = 0; i < kSlotRun; ++i) {
      const int slot = g * kSlotRun + i, row = (slot & ~31) + fp8_key_of_slot(slot & 31);
      keys_by_col[i] = *reinterpret_cast<const u32*>(&tile[staged_row(row, pitch) + 4 * cg]);
    }
    u32 cols[4][4];  // cols[c][q]: column 4cg + c, slots g * 16 + 4q .. + 3
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      u32 t[4];
      transpose_bytes(&keys_by_col[4 * q], t);
#pragma unroll
      for (int c = 0; c < 4; ++c) cols[c][q] = t[c];
    }
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (4 * cg + c < dv)
        st_global_16(vt + (i64)(4 * cg + c) * prm.keys + g * kSlotRun,
                     U32x4{cols[c][0], cols[c][1], cols[c][2], cols[c][3]});
  }
}
