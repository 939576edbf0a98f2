// V^T for the FP8 Hopper forward: wgmma reads e4m3 operands K-major only, so before the forward this pass
// writes V (keys x head dim, any strides, varlen through cu_seqlens_k) as (batch, kv head, head dim, keys)
// with the keys of every 32-key step in fp8_key_of_slot's order (fwd_sm90_config.h), which lets the
// forward feed its probabilities to P V without exchanging bytes between lanes. Stream-ordered before the
// forward; reads V once and writes it once.
#include "core/problem.h"
#include "cuda/common/common.cuh"
#include "cuda/hopper/fwd_sm90_config.h"

namespace {
using namespace flashport;
using namespace flashport::cuda;
using namespace flashport::cuda::hopper;

constexpr int kThreads = 256;
constexpr int kMaxDv = 256;
constexpr int kRowPad = 4;  // bytes after each staged key row: the column reads of a warp spread over banks
}  // namespace

/// Grid (sk rounded up / kFp8VtKeys, hk, batch), kThreads threads. Stage the CTA's kFp8VtKeys keys (zero
/// past the sequence's guarded length, problem.h), then write each head-dim column's 128 slots as 32-bit
/// words at the sequence's slots (fp8_vt_start). CTAs past the sequence's rounded-up length write nothing
/// (varlen: those slots are the next sequence's).
extern "C" __global__ void __launch_bounds__(kThreads)
    flashport_fp8_v_transpose(const __grid_constant__ flashport::cuda::hopper::Fp8VtParams prm) {
  __shared__ u8 tile[kFp8VtKeys][kMaxDv + kRowPad];
  const AttnProblem& p = prm.p;
  const int hk = (int)blockIdx.y, b = (int)blockIdx.z, dv = (int)p.dv;
  const i64 key0 = (i64)blockIdx.x * kFp8VtKeys;
  const i64 len = guarded_lengths(p, b).k;
  if (key0 >= len) return;
  const u8* v = static_cast<const u8*>(p.v.ptr);
  const int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
  for (int r = warp; r < kFp8VtKeys; r += kThreads / 32) {
    const i64 j = key0 + r;
    const i64 off = j < len ? k_offset(p, p.v, b, j, hk) : -1;
    if (off >= 0 && dv % 4 == 0 && reinterpret_cast<unsigned long long>(v + off) % 4 == 0) {
      for (int c = 4 * lane; c < dv; c += 128)  // a warp reads 128 bytes of the row per instruction
        *reinterpret_cast<u32*>(&tile[r][c]) = *reinterpret_cast<const u32*>(v + off + c);
    } else {
      for (int c = lane; c < dv; c += 32) tile[r][c] = off >= 0 ? v[off + c] : (u8)0;
    }
  }
  __syncthreads();
  constexpr int kWords = kFp8VtKeys / 4;    // 32-bit words per column
  const i64 slab = p.cu_seqlens_k ? 0 : b;  // varlen: one slab, sequences at their start slots
  u32* vt = reinterpret_cast<u32*>(prm.vt + (slab * p.hk + hk) * dv * prm.keys + fp8_vt_start(p, b) + key0);
  for (int idx = (int)threadIdx.x; idx < dv * kWords; idx += kThreads) {
    const int c = idx / kWords, slot = (idx % kWords) * 4;
    u32 w = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) w |= (u32)tile[(slot & ~31) + fp8_key_of_slot((slot + i) & 31)][c] << (8 * i);
    vt[(i64)c * (prm.keys / 4) + slot / 4] = w;
  }
}
