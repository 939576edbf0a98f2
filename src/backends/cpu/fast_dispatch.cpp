// The CPU fast path's entry points: what it covers, which ISA copy runs, the work lists and the
// OpenMP loops around the per-tile kernels (fast_forward.hpp, fast_backward.hpp).
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "backends/cpu/fast.hpp"
#include "backends/cpu/fast_common.hpp"
#include "core/tuning.hpp"

namespace flashport::cpu::fast {
namespace {

/// Asks Linux for the AMX tile state (process-wide, once); false where that is refused.
bool amx_permitted() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool granted = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
#else
  return false;
#endif
}

/// The widest kernel copy this CPU runs (AMX serves the bf16 forward when `forward`).
/// FLASHPORT_CPU_ISA=amx|avx512|avx2|base caps it ("avx512" keeps AMX off); the tests use this to cover
/// every copy on one machine. A wider request than the CPU supports is ignored; a value not in that list
/// is an Error naming the variable (core::cpu_isa_setting, read on each call so tests can switch it).
const Kernels& select_kernels(int in_type, bool forward) {
  const core::Knob<std::string> isa = core::cpu_isa_setting(core::process_env());
  const std::string& cap = isa.get();
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  const bool amx = avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("amx-tile") &&
                   __builtin_cpu_supports("amx-bf16");
  if (amx && forward && in_type == kBF16 && (cap.empty() || cap == "amx") && kernels_amx() &&
      amx_permitted()) {
    return *kernels_amx();
  }
  if (avx512 && cap != "avx2" && cap != "base" && kernels_avx512()) return *kernels_avx512();
  if (avx2 && cap != "base" && kernels_avx2()) return *kernels_avx2();
#endif
  return kernels_base();
}

/// Buffers a thread keeps between calls (OpenMP's pool threads persist), so repeated calls do not
/// page-fault fresh memory in; a buffer above kKeepBytes is released at the end of the call.
enum Slot : int { kScratch, kPacked, kDqPart, kSlots };
inline constexpr size_t kKeepBytes = 64u << 20;

struct ThreadBuffers {
  std::vector<float> slots[kSlots];

  static ThreadBuffers& mine() {
    thread_local ThreadBuffers buffers;
    return buffers;
  }
  /// `floats` floats, 64-byte aligned; contents are whatever the last call left.
  float* take(Slot slot, long long floats) {
    std::vector<float>& v = slots[slot];
    if ((long long)v.size() < floats + kMaxVec) v.resize((size_t)(floats + kMaxVec));
    const uintptr_t addr = reinterpret_cast<uintptr_t>(v.data());
    return v.data() + (pad_to((long long)addr, 64) - (long long)addr) / (long long)sizeof(float);
  }
  void trim(Slot slot) {
    if (slots[slot].size() * sizeof(float) > kKeepBytes) std::vector<float>().swap(slots[slot]);
  }
};

/// (sequence, position) of flattened query row `row` (see query_row).
std::pair<long long, long long> locate_row(const AttnProblem& p, long long row) {
  if (!p.cu_seqlens_q) return {row / p.sq, row % p.sq};
  long long lo = 0, hi = p.batch;  // last b with cu_seqlens_q[b] <= row, skipping empty sequences
  while (hi - lo > 1) {
    const long long mid = (lo + hi) / 2;
    if (p.cu_seqlens_q[mid] <= row) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return {lo, row - p.cu_seqlens_q[lo]};
}

long long query_rows(const AttnProblem& p) {
  return p.cu_seqlens_q ? p.total_q : p.batch * p.sq;
}

/// Whether the decode kernel (fast_decode.hpp) takes a forward: few queries per sequence, no dropout
/// (a training feature; its masks stay with the tiled kernel).
bool decode_covers(const AttnProblem& p) {
  return p.sq <= kDecodeMaxQueries && p.dropout_p == 0.0f;
}

/// Split-KV: the decode items' keys are cut into about kSplitsPerThread pieces per thread (the dynamic
/// schedule then evens out unequal lengths), never below kMinSplitKeys keys a piece (each split costs
/// a merge and a partial panel). Enough (sequence, kv head) items of equal length are never split.
inline constexpr long long kSplitsPerThread = 4;
inline constexpr long long kMinSplitKeys = 512;

/// The decode forward: items of (sequence, kv heads, rows chunk) over their visible key span, split
/// across the threads when there are too few of them, then split states merged by their LSE. Items
/// of few rows (one token of a GQA group) take several kv heads (decode_heads), whose rows lie side by
/// side in the cache: each panel of keys then reads the cache in memory order.
void decode(const AttnProblem& p) {
  const Kernels& kernels = select_kernels(p.in_type, false);  // never AMX: decode streams K/V
  const long long group = gqa_group(p);
  struct Item {
    long long b, hk, heads, row0, rows;
    sem::KeyRange span;
    long long pieces, partial;  // key splits; float offset of the first split's state when split
  };
  std::vector<Item> items;
  long long total_keys = 0;  // keys x heads
  for (long long b = 0; b < p.batch; ++b) {
    const long long sq = seqlen_q(p, b), sk = seqlen_k(p, b), rows = sq * group;
    const long long heads = decode_heads(rows, p.hk);
    for (long long hk = 0; hk < p.hk; hk += heads) {
      const long long nh = std::min(heads, p.hk - hk);
      for (long long row0 = 0; row0 < rows; row0 += kDecodeRows) {
        const long long n = std::min<long long>(kDecodeRows, rows - row0);
        // The chunk's query positions see the union of their visible ranges (sem::tile_keys).
        const sem::KeyRange span =
            sem::tile_keys(row0 / group, (row0 + n - 1) / group + 1, sq, sk, p.window_left, p.window_right);
        items.push_back({b, hk, nh, row0, n, span, 1, -1});
        total_keys += nh * std::max<long long>(0, span.hi - span.lo);
      }
    }
  }
  const long long threads = omp_get_max_threads();
  const long long chunk = std::max(
      kMinSplitKeys,
      pad_to((total_keys + kSplitsPerThread * threads - 1) / (kSplitsPerThread * threads), kDecodeKeys));
  std::vector<DecodeBlock> blocks;
  std::vector<const Item*> split;
  long long partial_floats = 0;
  for (Item& it : items) {
    const long long len = std::max<long long>(0, it.span.hi - it.span.lo);
    it.pieces = std::max<long long>(
        1, std::min((len * it.heads + chunk - 1) / chunk, (len + kMinSplitKeys - 1) / kMinSplitKeys));
    if (it.pieces > 1) {
      it.partial = partial_floats;
      partial_floats += it.pieces * it.heads * it.rows * (p.dv + 1);
    }
  }
  float* partials = ThreadBuffers::mine().take(kPacked, partial_floats);
  for (Item& it : items) {
    if (it.pieces == 1) {
      blocks.push_back({it.b, it.hk, it.heads, it.row0, it.rows, it.span.lo, it.span.hi, nullptr});
      continue;
    }
    split.push_back(&it);
    const long long len = it.span.hi - it.span.lo;
    const long long piece = pad_to((len + it.pieces - 1) / it.pieces, kDecodeKeys);
    for (long long s = 0; s < it.pieces; ++s) {
      const long long j0 = std::min(it.span.hi, it.span.lo + s * piece);
      const long long j1 = std::min(it.span.hi, j0 + piece);
      blocks.push_back({it.b, it.hk, it.heads, it.row0, it.rows, j0, j1,
                        partials + it.partial + s * it.heads * it.rows * (p.dv + 1)});
    }
  }
  // Longest first, so the dynamic schedule ends with the short ones.
  std::stable_sort(blocks.begin(), blocks.end(), [](const DecodeBlock& x, const DecodeBlock& y) {
    return (x.j1 - x.j0) * x.heads > (y.j1 - y.j0) * y.heads;
  });
  const long long n_blocks = (long long)blocks.size(), n_split = (long long)split.size();
  const long long scratch_n = scratch_floats(p.d, p.dv);
  // Without splits the blocks are the whole call: no barrier between them and the region's end (each
  // costs a time slice when a thread is descheduled on a busy machine).
#pragma omp parallel
  {
    float* scratch = ThreadBuffers::mine().take(kScratch, scratch_n);
#pragma omp for schedule(dynamic, 1) nowait
    for (long long n = 0; n < n_blocks; ++n) kernels.decode_block(p, blocks[(size_t)n], scratch);
    if (n_split > 0) {
      // Merge each split item's states once all are written: out = sum_s w_s O_s / sum_s w_s, w_s =
      // exp(lse_s - max lse) (sem::lse_weight, merge_states' rule); no key in any split gives 0, -inf.
#pragma omp barrier
#pragma omp for schedule(dynamic, 1) nowait
      for (long long n = 0; n < n_split; ++n) {
        const Item& it = *split[(size_t)n];
        const long long state = it.rows * (p.dv + 1), piece = it.heads * state;
        for (long long h = 0; h < it.heads; ++h) {
          const float* first = partials + it.partial + h * state;
          for (long long r = 0; r < it.rows; ++r) {
            float lse_max = sem::kNegInf;
            for (long long s = 0; s < it.pieces; ++s)
              lse_max = std::max(lse_max, first[s * piece + it.rows * p.dv + r]);
            float weight_sum = 0.0f;
            float* acc = scratch;
            std::fill(acc, acc + p.dv, 0.0f);
            for (long long s = 0; s < it.pieces; ++s) {
              const float w = sem::lse_weight(first[s * piece + it.rows * p.dv + r], lse_max);
              if (w == 0.0f) continue;
              weight_sum += w;
              const float* o_s = first + s * piece + r * p.dv;
              for (long long c = 0; c < p.dv; ++c) acc[c] += w * o_s[c];
            }
            const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
            const long long i = (it.row0 + r) / group;
            const long long hq = group_head(it.hk + h, group, (it.row0 + r) % group);
            const long long o_off = q_offset(p, p.o, it.b, i, hq);
            for (long long c = 0; c < p.dv; ++c)
              store(p.o.ptr, p.out_type, o_off + c, (double)(acc[c] * inv));
            if (p.lse) {
              p.lse[lse_offset(p, it.b, hq, i)] =
                  weight_sum > 0.0f ? lse_max + std::log(weight_sum) : sem::kNegInf;
            }
          }
        }
      }
    }
  }
  ThreadBuffers::mine().trim(kPacked);
}

}  // namespace

std::string unsupported(const AttnProblem& p, bool backward) {
  if (p.in_type == kE4M3 || p.in_type == kE4M3FNUZ || p.in_type == kE5M2)
    return "fp8 inputs run on the reference (the fast path has no fp8 kernels)";
  if (p.in_type == kF64) return "fp64 inputs run on the reference (the fast path computes in fp32)";
  if (p.s_dmask) return "s_dmask (attention probabilities) is produced by the reference only";
  if (p.sq >= (1LL << 30) || p.sk >= (1LL << 30)) return "sequences of 2^30 tokens or more";
  if (backward && p.block_table) return "backward through paged K/V runs on the reference";
  if (backward && (p.leftpad_k || p.kv_batch_idx)) return "backward through a KV cache runs on the reference";
  if (backward && !p.lse) return "backward needs the forward's LSE";
  return {};
}

const char* forward_isa(int in_type, bool decode) {
  return select_kernels(in_type, !decode).isa;
}

void forward(const AttnProblem& p) {
  if (decode_covers(p)) {
    decode(p);
    return;
  }
  const Kernels& kernels = select_kernels(p.in_type, true);
  const long long group = gqa_group(p);

  // Each (sequence, kv head) whose K/V feed several query tiles gets them packed once into a shared
  // region (contiguous rows also stay in L2, where head-strided rows thrash its sets). Groups are
  // packed in rounds of at most kMaxPackedBytes; a round is one parallel packing loop, a barrier and
  // one dynamic loop over the round's query tiles. The other groups (decode-like shapes, K/V too big
  // to pack) pack tile by tile. Later query tiles first: under a causal mask they see the most keys,
  // so the dynamic schedule ends with the cheap ones.
  struct PackJob {
    long long b, hk, j0, j1, sk, group;  // keys [j0, j1) of a group of sk keys at float offset `group`
  };
  struct Round {
    std::vector<PackJob> packs;
    std::vector<QueryBlock> tiles;
    std::vector<long long> tile_group;  // float offset of each tile's group region
  };
  std::vector<Round> rounds(1);
  std::vector<QueryBlock> loose;
  struct GroupJob {
    long long b, hk, sk, floats;
    size_t first_tile;  // in its round's tiles; its tiles run to the next group's first
  };
  std::vector<GroupJob> groups;
  long long max_group_floats = 0;
  long long round_floats = 0, max_round_floats = 0;
  for (long long b = 0; b < p.batch; ++b) {
    const long long n_tiles = (seqlen_q(p, b) + kBlockQ - 1) / kBlockQ, sk = seqlen_k(p, b);
    const long long floats = pad_to(kernels.packed_floats(p, sk), kMaxVec);
    for (long long hk = 0; hk < p.hk; ++hk) {
      if (n_tiles == 0) continue;
      if (group * n_tiles < 2 || floats * 4 > kMaxPackedBytes) {
        for (long long t = n_tiles - 1; t >= 0; --t) {
          for (long long g = 0; g < group; ++g) loose.push_back({b, group_head(hk, group, g), t * kBlockQ});
        }
        continue;
      }
      if ((round_floats + floats) * 4 > kMaxPackedBytes) {
        rounds.emplace_back();
        round_floats = 0;
      }
      Round& r = rounds.back();
      groups.push_back({b, hk, sk, floats, r.tiles.size()});
      max_group_floats = std::max(max_group_floats, floats);
      for (long long j0 = 0; j0 < sk; j0 += kBlockK) {
        r.packs.push_back({b, hk, j0, std::min(sk, j0 + kBlockK), sk, round_floats});
      }
      for (long long t = n_tiles - 1; t >= 0; --t) {
        for (long long g = 0; g < group; ++g) {
          r.tiles.push_back({b, group_head(hk, group, g), t * kBlockQ});
          r.tile_group.push_back(round_floats);
        }
      }
      round_floats += floats;
      max_round_floats = std::max(max_round_floats, round_floats);
    }
  }
  const long long n_loose = (long long)loose.size(), scratch_n = scratch_floats(p.d, p.dv);
  const long long n_groups = (long long)groups.size();
  if (rounds.size() == 1 && max_group_floats * 4 <= kGroupInCacheBytes &&
      n_groups >= kGroupsPerThread * omp_get_max_threads()) {
    // Many small groups: a thread packs a whole group into its own buffer and runs the group's tiles
    // at once, so they read K/V from its L2 (the rounds below pack everything first, then read it
    // back from L3, on another core for half the tiles). AVX2 fp32 d 128 s 512: 161 -> 171 GFLOPS.
    const Round& r = rounds[0];
#pragma omp parallel
    {
      float* scratch = ThreadBuffers::mine().take(kScratch, scratch_n);
      float* mine = ThreadBuffers::mine().take(kPacked, max_group_floats);
#pragma omp for schedule(dynamic, 1) nowait
      for (long long n = 0; n < n_groups; ++n) {
        const GroupJob& g = groups[(size_t)n];
        kernels.pack_kv(p, g.b, g.hk, 0, g.sk, g.sk, mine);
        const size_t end = n + 1 < n_groups ? groups[(size_t)n + 1].first_tile : r.tiles.size();
        for (size_t t = g.first_tile; t < end; ++t) kernels.forward_block(p, r.tiles[t], mine, scratch);
      }
#pragma omp for schedule(dynamic, 1)
      for (long long n = 0; n < n_loose; ++n) kernels.forward_block(p, loose[(size_t)n], nullptr, scratch);
      ThreadBuffers::mine().trim(kPacked);
    }
    return;
  }
  float* packed = ThreadBuffers::mine().take(kPacked, max_round_floats);
#pragma omp parallel
  {
    float* scratch = ThreadBuffers::mine().take(kScratch, scratch_n);
    for (const Round& r : rounds) {
      const long long n_packs = (long long)r.packs.size(), n_tiles = (long long)r.tiles.size();
#pragma omp for schedule(dynamic, 4)
      for (long long n = 0; n < n_packs; ++n) {
        const PackJob& job = r.packs[(size_t)n];
        kernels.pack_kv(p, job.b, job.hk, job.j0, job.j1, job.sk, packed + job.group);
      }
#pragma omp for schedule(dynamic, 1)
      for (long long n = 0; n < n_tiles; ++n) {
        kernels.forward_block(p, r.tiles[(size_t)n], packed + r.tile_group[(size_t)n], scratch);
      }
    }
#pragma omp for schedule(dynamic, 1)
    for (long long n = 0; n < n_loose; ++n) kernels.forward_block(p, loose[(size_t)n], nullptr, scratch);
  }
  ThreadBuffers::mine().trim(kPacked);
}

void backward(const AttnProblem& p) {
  const Kernels& kernels = select_kernels(p.in_type, false);
  const long long rows = query_rows(p), dq_ld = pad_to(p.d, kMaxVec), group = gqa_group(p);
  const QueryTileLayout qt = query_tile_layout(p.d, p.dv);

  // Rounds of (sequence, kv head) groups whose packed query tiles fit kMaxPackedBytes (a group
  // larger than that gets a round of its own). A round packs its query tiles (Q, dO, LSE, D) once,
  // in parallel, then runs its key blocks.
  struct TileJob {
    long long b, h, i0, dst;  // query tile and its offset in the packed buffer
  };
  struct Round {
    std::vector<TileJob> tiles;
    std::vector<KeyBlock> blocks;
    long long floats = 0;
  };
  std::vector<Round> rounds(1);
  long long max_floats = 0;
  for (long long b = 0; b < p.batch; ++b) {
    const long long n_tiles = (seqlen_q(p, b) + kBlockQ - 1) / kBlockQ, sk = seqlen_k(p, b);
    const long long group_floats = group * n_tiles * qt.floats;
    for (long long hk = 0; hk < p.hk; ++hk) {
      if (rounds.back().floats > 0 && (rounds.back().floats + group_floats) * 4 > kMaxPackedBytes) {
        rounds.emplace_back();
      }
      Round& r = rounds.back();
      for (long long hl = 0; hl < group; ++hl) {
        for (long long t = 0; t < n_tiles; ++t) {
          r.tiles.push_back(
              {b, group_head(hk, group, hl), t * kBlockQ, r.floats + (hl * n_tiles + t) * qt.floats});
        }
      }
      for (long long j0 = 0; j0 < sk; j0 += kBlockK) r.blocks.push_back({b, hk, j0, r.floats});
      r.floats += group_floats;
      max_floats = std::max(max_floats, r.floats);
    }
  }
  float* tiles = ThreadBuffers::mine().take(kPacked, max_floats);
  const BackwardShared shared{tiles, rows, dq_ld};

  // Each thread adds dQ into its own fp32 buffer. The static round-robin schedule fixes which
  // thread runs which key block, and the buffers are summed in thread order, so dQ is bitwise
  // reproducible for a given thread count (deterministic or not).
  const long long scratch_n = scratch_floats(p.d, p.dv), dq_floats = p.hq * rows * dq_ld;
  std::vector<float*> dq_parts((size_t)omp_get_max_threads(), nullptr);
#pragma omp parallel
  {
    float* dq_part = ThreadBuffers::mine().take(kDqPart, dq_floats);
    std::fill(dq_part, dq_part + dq_floats, 0.0f);
    dq_parts[(size_t)omp_get_thread_num()] = dq_part;
    float* scratch = ThreadBuffers::mine().take(kScratch, scratch_n);
    for (const Round& r : rounds) {
      const long long n_tiles = (long long)r.tiles.size(), n_blocks = (long long)r.blocks.size();
#pragma omp for schedule(dynamic, 1)
      for (long long n = 0; n < n_tiles; ++n) {
        const TileJob& job = r.tiles[(size_t)n];
        kernels.pack_query_tile(p, job.b, job.h, job.i0, tiles + job.dst);
      }
#pragma omp for schedule(static, 1)
      for (long long n = 0; n < n_blocks; ++n) {
        kernels.backward_block(p, shared, r.blocks[(size_t)n], scratch, dq_part);
      }
    }
#pragma omp for schedule(static)
    for (long long row = 0; row < rows; ++row) {
      const auto [b, i] = locate_row(p, row);
      for (long long h = 0; h < p.hq; ++h) {
        const long long src = (h * rows + row) * dq_ld, dst = q_offset(p, p.grad_q, b, i, h);
        for (long long c = 0; c < p.d; ++c) {
          float acc = 0.0f;
          for (const float* part : dq_parts) {
            if (part) acc += part[src + c];
          }
          store(p.grad_q.ptr, p.in_type, dst + c, (double)(acc * p.scale));
        }
      }
    }
    ThreadBuffers::mine().trim(kDqPart);
  }
  ThreadBuffers::mine().trim(kPacked);

  // Keys past seqused_k get no gradient: zero their dK/dV rows.
  for (long long b = 0; b < p.batch; ++b) {
    for (long long j = seqlen_k(p, b); j < key_rows(p, b); ++j) {
      for (long long hk = 0; hk < p.hk; ++hk) {
        const long long k_off = k_offset(p, p.grad_k, b, j, hk), v_off = k_offset(p, p.grad_v, b, j, hk);
        for (long long c = 0; c < p.d; ++c) store(p.grad_k.ptr, p.in_type, k_off + c, 0.0);
        for (long long c = 0; c < p.dv; ++c) store(p.grad_v.ptr, p.in_type, v_off + c, 0.0);
      }
    }
  }
}

}  // namespace flashport::cpu::fast
