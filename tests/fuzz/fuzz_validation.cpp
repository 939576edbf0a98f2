// libFuzzer target over the public API's validation: forward, backward, forward_kvcache, merge_states.
//
// The input decodes into a *valid* call first (sizes, dtype, options, index tensors that agree with the
// shapes), which each tensor and option then mutates: dtype (invalid enum values included), device, null
// data, a dimension replaced or dropped, strides (0, negative, huge), index values. A zero byte always
// means "keep the valid choice", so an all-zero tail is a valid call and the seed corpus
// (gen_corpus.py) only writes the leading bytes. Reading past the end yields zeros.
//
// Every tensor is backed by a heap buffer of exactly the extent its view claims (no bytes for a view
// with a zero or negative extent), so any out-of-bounds access ASan reports is a library bug, never a
// harness artefact. The library may throw flashport::Error; anything else (crash, sanitizer report,
// other exception) is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "flashport/flashport.hpp"

namespace {

using namespace flashport;
using i64 = int64_t;

constexpr i64 kI64Max = std::numeric_limits<i64>::max();
constexpr i64 kI64Min = std::numeric_limits<i64>::min();
// Keeps one execution cheap (the CPU computation runs whenever validation passes) and the process small.
constexpr i64 kMaxBufferBytes = i64(4) << 20;
constexpr i64 kMaxWork = i64(1) << 22;

struct Skip {};  // the input asks for more memory or work than one execution may take

// FUZZ_VERBOSE=1: print each tensor, index values and the rejection (triage of a crash input, checking
// that a seed is a valid call).
bool verbose() {
  static const bool on = std::getenv("FUZZ_VERBOSE") != nullptr;
  return on;
}

class Bytes {
 public:
  Bytes(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(u8()) << (8 * i);
    return v;
  }
  template <class T, size_t N>
  T pick(const T (&table)[N]) {
    return table[u8() % N];
  }
  /// A size: 0..9 for most bytes, else a value that stresses range checks and size arithmetic.
  i64 size() {
    static constexpr i64 special[] = {10,
                                      16,
                                      32,
                                      64,
                                      128,
                                      256,
                                      257,
                                      -1,
                                      -2,
                                      i64(1) << 31,
                                      (i64(1) << 31) - 1,
                                      i64(1) << 32,
                                      i64(1) << 62,
                                      kI64Max,
                                      kI64Min,
                                      3 * (i64(1) << 61)};
    const uint8_t x = u8();
    return x < 0xF0 ? x % 10 : special[x - 0xF0];
  }

 private:
  const uint8_t* p_;
  size_t n_, i_ = 0;
};

bool mul_ok(i64 a, i64 b, i64* r) {
  return !__builtin_mul_overflow(a, b, r);
}
// Sizes derived from the fuzzer's values wrap like the two's-complement machine (never UB in the
// harness); a wrapped size is just one more odd value for the API to reject.
i64 add(i64 a, i64 b) {
  return i64(uint64_t(a) + uint64_t(b));
}
i64 mul(i64 a, i64 b) {
  return i64(uint64_t(a) * uint64_t(b));
}

/// Owns the buffers of one execution.
class Arena {
 public:
  ~Arena() {
    for (void* p : bufs_) std::free(p);
  }
  /// Exactly `bytes` bytes (malloc(0) for none: a unique pointer ASan reports on any access).
  void* alloc(i64 bytes) {
    void* p = std::malloc(size_t(bytes));
    if (!p) throw Skip{};
    if (bytes) std::memset(p, 0, size_t(bytes));
    bufs_.push_back(p);
    return p;
  }

 private:
  std::vector<void*> bufs_;
};

/// What a view can touch: `bytes` = 0 when a dimension is 0 or negative (an empty or nonsensical
/// claim), else (highest - lowest element offset + 1) * element size; `lo` = the lowest element
/// offset (<= 0, negative strides). Throws Skip past kMaxBufferBytes.
struct Extent {
  i64 lo = 0, bytes = 0;
};
Extent extent(const TensorView& t) {
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] <= 0) return {};
  i64 lo = 0, hi = 0, reach;
  for (int d = 0; d < t.ndim; ++d) {
    if (!mul_ok(t.shape[d] - 1, t.stride[d], &reach)) throw Skip{};
    if (__builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi)) throw Skip{};
  }
  i64 span, bytes;
  if (__builtin_sub_overflow(hi, lo, &span) || span >= kMaxBufferBytes ||
      !mul_ok(span + 1, dtype_size(t.dtype), &bytes) || bytes > kMaxBufferBytes)
    throw Skip{};
  return {lo, bytes};
}

/// Decodes tensors: the valid view, then the mutations the next byte selects.
class Maker {
 public:
  Maker(Bytes& in, Arena& arena) : in_(in), arena_(arena) {}

  TensorView tensor(DType dtype, std::initializer_list<i64> shape) {
    TensorView t;
    t.dtype = dtype;
    t.ndim = int(shape.size());
    int d = 0;
    for (i64 s : shape) t.shape[d++] = s;
    const uint8_t m = in_.u8();
    if (m & 0x01) t.dtype = DType(in_.u8());  // any byte: invalid enum values included
    if (m & 0x02) t.device = Device{DeviceType(in_.u8() % 4), int(in_.u8()) - 1};
    if (m & 0x04) {                                       // change the rank, then maybe one extent
      const int nd = int(in_.u8() % (kMaxDims + 2)) - 1;  // -1..4
      for (int i = t.ndim; i < std::max(nd, 0); ++i) t.shape[i] = 1 + in_.u8() % 3;
      t.ndim = nd;
    }
    if ((m & 0x08) && t.ndim > 0) t.shape[in_.u8() % t.ndim] = in_.size();
    i64 n = 1;  // row-major strides first, saturating: only honest extents get a buffer anyway
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.stride[i] = n;
      if (!mul_ok(n, std::max<i64>(t.shape[i], 1), &n)) n = kI64Max;
    }
    if (m & 0x10)
      for (int i = 0; i < t.ndim; ++i) t.stride[i] = stride(t.stride[i]);
    const Extent e = extent(t);
    // The lowest reachable element starts the buffer, or the previous tensor's buffer when that one
    // covers this view (aliasing, which outputs must reject).
    char* base =
        (m & 0x20) && last_ && e.bytes <= last_bytes_ ? last_ : static_cast<char*>(arena_.alloc(e.bytes));
    const bool alias = base == last_;
    if (!alias) last_ = base, last_bytes_ = e.bytes;
    t.data = base - e.lo * dtype_size(t.dtype);
    if (m & 0x40) t.data = nullptr;
    if (verbose()) {
      std::fprintf(stderr, "tensor %s strides", t.describe().c_str());
      for (int i = 0; i < t.ndim; ++i) std::fprintf(stderr, " %lld", (long long)t.stride[i]);
      std::fprintf(stderr, " buffer %lld bytes%s%s\n", (long long)e.bytes,
                   alias ? " (the previous one's)" : "", t.data ? "" : " null");
    }
    return t;
  }
  std::optional<TensorView> maybe(bool present, DType dtype, std::initializer_list<i64> shape) {
    if (!present) return std::nullopt;
    return tensor(dtype, shape);
  }

  /// An int32 host index tensor holding `values`, mutated like any tensor; then a byte whose low bit
  /// replaces every value by the fuzzer's raw choice.
  TensorView index(std::vector<int32_t> values, std::initializer_list<i64> shape) {
    TensorView t = tensor(DType::i32, shape);
    const bool raw = in_.u8() & 1;
    if (t.dtype != DType::i32 || t.data == nullptr) return t;
    // Fills the buffer from its start, the view's lowest element, in memory order.
    const Extent e = extent(t);
    auto* v = static_cast<int32_t*>(t.data) + e.lo;
    for (i64 i = 0; i < e.bytes / 4; ++i) {
      v[i] = raw ? int32_t(in_.u32()) : i < i64(values.size()) ? values[size_t(i)] : 0;
      if (verbose()) std::fprintf(stderr, "%s%d", i ? " " : "  values ", v[i]);
    }
    if (verbose() && e.bytes) std::fprintf(stderr, "\n");
    return t;
  }

 private:
  i64 stride(i64 natural) {
    static constexpr i64 table[] = {0, 1, -1, 2, 3, -7, i64(1) << 31, i64(1) << 40, kI64Max, kI64Min, 1000};
    const uint8_t x = in_.u8();
    if (x < 0x80) return natural;
    if (x < 0xC0) return add(mul(natural, 2), x & 1);  // padded rows: honest, the buffer grows with it
    return table[x % (sizeof table / sizeof table[0])];
  }

  Bytes& in_;
  Arena& arena_;
  char* last_ = nullptr;
  i64 last_bytes_ = 0;
};

double real(Bytes& in, double valid) {
  static constexpr double table[] = {0.0,
                                     -0.0,
                                     1.0,
                                     -1.0,
                                     0.5,
                                     1e-3,
                                     1e300,
                                     -1e300,
                                     std::numeric_limits<double>::quiet_NaN(),
                                     std::numeric_limits<double>::infinity(),
                                     -std::numeric_limits<double>::infinity(),
                                     5e-324,
                                     0.999999,
                                     30.0};
  const uint8_t x = in.u8();
  return x == 0 ? valid : table[x % (sizeof table / sizeof table[0])];
}

i64 window(Bytes& in) {
  static constexpr i64 special[] = {-2,           kI64Max,     kI64Min, i64(1) << 31, (i64(1) << 31) - 1,
                                    i64(1) << 62, kI64Max - 1, 1000};
  const uint8_t x = in.u8();
  return x < 0xF0 ? i64(x % 12) - 1 : special[x % (sizeof special / sizeof special[0])];
}

// The problem: sizes shared by every entry point. Values are the fuzzer's; the check only keeps each
// execution small (kMaxWork over the loop extents, non-negative ones: validation rejects the others),
// so the fp64 reference under ASan stays far inside libFuzzer's -timeout. Query and key lengths count as
// whole 64-row tiles, which is what the CPU fast path computes: b 64 x sq 3 x hq 64 (sk 64, d 4) passed
// the unpadded bound, and its backward took 5.6 s under the sanitizers (29 s on a busy machine, past
// the 20 s -timeout).
struct Sizes {
  i64 b, sq, sk, hq, hk, d, dv, page, blocks, s_new;
  explicit Sizes(Bytes& in)
      : b(in.size()),
        sq(in.size()),
        sk(in.size()),
        hq(in.size()),
        hk(in.size()),
        d(in.size()),
        dv(in.size()),
        page(in.size()),
        blocks(in.size()),
        s_new(in.size()) {
    constexpr i64 kTile = 64;  // cpu/fast_common.hpp kBlockQ, kBlockK
    const auto tiles = [](i64 n) {
      return n > 0 && n < (i64(1) << 40) ? (n + kTile - 1) / kTile * kTile : n;
    };
    i64 work = 1;
    for (i64 v : {b, tiles(sq), tiles(sk), hq, page, blocks, s_new, std::max(d, dv)})
      if (!mul_ok(work, std::max<i64>(v, 1), &work) || work > kMaxWork) throw Skip{};
  }
};

// Per-sequence lengths in [0, max] (0 where max is not a usable bound) and their prefix sums.
std::vector<int32_t> lengths(Bytes& in, i64 n, i64 max) {
  std::vector<int32_t> v(size_t(std::max<i64>(n, 0)));
  for (auto& x : v) x = max > 0 && max < 1000 ? int32_t(in.u8() % (max + 1)) : 0;
  return v;
}
std::vector<int32_t> prefix(const std::vector<int32_t>& len) {
  std::vector<int32_t> cu{0};
  for (int32_t x : len) cu.push_back(cu.back() + x);
  return cu;
}
i64 total(const std::vector<int32_t>& len) {
  return prefix(len).back();
}
/// block_table rows: valid block ids (the fuzzer's choice modulo `blocks`).
std::vector<int32_t> table(Bytes& in, i64 rows, i64 cols, i64 blocks) {
  std::vector<int32_t> v;
  for (i64 i = 0; i < mul(rows, cols) && i < 4096; ++i)
    v.push_back(blocks > 0 ? int32_t(in.u8() % blocks) : 0);
  return v;
}

AttentionOptions options(Bytes& in, Maker& mk, const Sizes& s) {
  AttentionOptions o;
  const uint8_t f = in.u8();
  o.causal = f & 0x01;
  if (f & 0x02) o.window_left = window(in), o.window_right = window(in);
  if (f & 0x04) o.softcap = real(in, 30.0);
  if (f & 0x08) o.softmax_scale = real(in, 0.125);
  if (f & 0x10) o.dropout_p = real(in, 0.25), o.dropout_seed = in.u32(), o.dropout_offset = in.u32();
  o.deterministic = f & 0x20;
  if (f & 0x40)
    o.alibi_slopes = (in.u8() & 1) ? mk.tensor(DType::f32, {s.hq}) : mk.tensor(DType::f32, {s.b, s.hq});
  if (f & 0x80) {
    const uint8_t which = in.u8();
    o.q_descale = mk.maybe(which & 1, DType::f32, {s.b, s.hk});
    o.k_descale = mk.maybe(which & 2, DType::f32, {s.b, s.hk});
    o.v_descale = mk.maybe(which & 4, DType::f32, {s.b, s.hk});
  }
  if (verbose())
    std::fprintf(stderr, "options causal %d window %lld %lld softcap %g scale %g dropout %g\n", o.causal,
                 (long long)o.window_left, (long long)o.window_right, o.softcap, o.softmax_scale.value_or(-1),
                 o.dropout_p);
  return o;
}

// forward / backward share the layout: dense, varlen (flags 0x01), paged (0x02), seqused_k (0x04).
struct Attention {
  TensorView q, k, v, out, lse;
  SequenceLayout lay;
  bool has_lse;
};

Attention attention(Bytes& in, Maker& mk, const Sizes& s, DType dt, uint8_t flags) {
  Attention a;
  const bool varlen = flags & 0x01, paged = flags & 0x02;
  a.has_lse = flags & 0x08;
  i64 total_q = 0;
  std::vector<int32_t> len_k;
  if (varlen) {
    const auto len_q = lengths(in, s.b, s.sq);
    len_k = lengths(in, s.b, paged ? std::min(s.sk, mul(s.page, s.blocks)) : s.sk);
    total_q = total(len_q);
    a.lay.max_seqlen_q = s.sq, a.lay.max_seqlen_k = s.sk;
    a.lay.cu_seqlens_q = mk.index(prefix(len_q), {add(s.b, 1)});
    if (!paged || (flags & 0x10)) a.lay.cu_seqlens_k = mk.index(prefix(len_k), {add(s.b, 1)});
    a.q = mk.tensor(dt, {total_q, s.hq, s.d});
  } else {
    a.q = mk.tensor(dt, {s.b, s.sq, s.hq, s.d});
  }
  if (paged) {
    const i64 cols = s.page > 0 ? add(s.sk, add(s.page, -1)) / s.page : 0;
    a.k = mk.tensor(dt, {s.blocks, s.page, s.hk, s.d});
    a.v = mk.tensor(dt, {s.blocks, s.page, s.hk, s.dv});
    a.lay.block_table = mk.index(table(in, s.b, cols, s.blocks), {s.b, cols});
  } else if (varlen) {
    a.k = mk.tensor(dt, {total(len_k), s.hk, s.d});
    a.v = mk.tensor(dt, {total(len_k), s.hk, s.dv});
  } else {
    a.k = mk.tensor(dt, {s.b, s.sk, s.hk, s.d});
    a.v = mk.tensor(dt, {s.b, s.sk, s.hk, s.dv});
  }
  if (flags & 0x04) {
    std::vector<int32_t> used = len_k.empty() ? lengths(in, s.b, s.sk) : len_k;
    for (auto& u : used) u = u ? int32_t(in.u8() % (u + 1)) : 0;
    a.lay.seqused_k = mk.index(used, {s.b});
  }
  const DType out_dt = is_fp8(dt) ? DType::bf16 : dt;
  a.out = varlen ? mk.tensor(out_dt, {total_q, s.hq, s.dv}) : mk.tensor(out_dt, {s.b, s.sq, s.hq, s.dv});
  a.lse = varlen ? mk.tensor(DType::f32, {s.hq, total_q}) : mk.tensor(DType::f32, {s.b, s.hq, s.sq});
  return a;
}

void run_forward(Bytes& in, Maker& mk, const Sizes& s, DType dt, uint8_t flags) {
  Attention t = attention(in, mk, s, dt, flags);
  ForwardArgs a;
  a.q = t.q, a.k = t.k, a.v = t.v, a.out = t.out, a.layout = t.lay;
  if (t.has_lse) a.lse = t.lse;
  if (flags & 0x20) a.s_dmask = mk.tensor(DType::f32, {s.b, s.hq, s.sq, s.sk});
  a.options = options(in, mk, s);
  forward(a);
}

void run_backward(Bytes& in, Maker& mk, const Sizes& s, DType dt, uint8_t flags) {
  Attention t = attention(in, mk, s, dt, flags);
  BackwardArgs a;
  a.q = t.q, a.k = t.k, a.v = t.v, a.out = t.out, a.lse = t.lse, a.layout = t.lay;
  auto like = [&](const TensorView& x) {
    return x.ndim == 4 ? mk.tensor(x.dtype, {x.shape[0], x.shape[1], x.shape[2], x.shape[3]})
                       : mk.tensor(x.dtype, {x.shape[0], x.shape[1], x.shape[2]});
  };
  a.dout = like(t.out), a.dq = like(t.q), a.dk = like(t.k), a.dv = like(t.v);
  a.options = options(in, mk, s);
  backward(a);
}

void run_kvcache(Bytes& in, Maker& mk, const Sizes& s, DType dt, uint8_t flags) {
  KvCacheArgs a;
  const bool paged = flags & 0x02, append = flags & 0x01;
  const i64 s_new = append ? s.s_new : 0;
  a.q = mk.tensor(dt, {s.b, s.sq, s.hq, s.d});
  // Dense cache: (rows, sk, hk, d) with `blocks` rows through cache_batch_idx, else b rows.
  const i64 rows = (flags & 0x10) && !paged ? s.blocks : s.b;
  const i64 capacity = paged ? mul(s.page, s.blocks) : s.sk;
  a.k_cache = paged ? mk.tensor(dt, {s.blocks, s.page, s.hk, s.d}) : mk.tensor(dt, {rows, s.sk, s.hk, s.d});
  a.v_cache = paged ? mk.tensor(dt, {s.blocks, s.page, s.hk, s.dv}) : mk.tensor(dt, {rows, s.sk, s.hk, s.dv});
  a.out = mk.tensor(dt, {s.b, s.sq, s.hq, s.dv});
  if (append) {
    a.k_new = mk.tensor(dt, {s.b, s_new, s.hk, s.d});
    a.v_new = mk.tensor(dt, {s.b, s_new, s.hk, s.dv});
  }
  std::vector<int32_t> seqlens = lengths(in, s.b, std::max<i64>(add(capacity, mul(s_new, -1)), 0));
  if (append || (flags & 0x04)) a.cache_seqlens = mk.index(seqlens, {s.b});
  if (paged) {
    const i64 cols = s.page > 0 ? s.blocks : 0;
    a.block_table = mk.index(table(in, s.b, cols, s.blocks), {s.b, cols});
  }
  if ((flags & 0x10) && !paged) {
    std::vector<int32_t> idx;
    for (i64 i = 0; i < s.b; ++i) idx.push_back(rows > 0 ? int32_t(in.u8() % rows) : 0);
    a.cache_batch_idx = mk.index(idx, {s.b});
  }
  if (flags & 0x20) {
    std::vector<int32_t> pad;
    for (int32_t n : seqlens) pad.push_back(int32_t(in.u8() % (n + 1)));
    a.cache_leftpad = mk.index(pad, {s.b});
  }
  if (flags & 0x40) {  // rotary over the first 2 * (d / 4) channels, positions up to capacity + sq
    const i64 half = std::max<i64>(s.d / 4, 1);
    a.rotary_cos = mk.tensor(dt, {add(capacity, s.sq), half});
    a.rotary_sin = mk.tensor(dt, {add(capacity, s.sq), half});
    a.rotary_interleaved = in.u8() & 1;
  }
  if (flags & 0x08) a.lse = mk.tensor(DType::f32, {s.b, s.hq, s.sq});
  a.num_splits = int(in.u8() % 4) - 1;
  a.options = options(in, mk, s);
  forward_kvcache(a);
}

void run_merge(Bytes& in, Maker& mk, const Sizes& s, DType dt, uint8_t flags) {
  MergeArgs a;
  a.out_a = mk.tensor(dt, {s.b, s.sq, s.hq, s.d});
  a.lse_a = mk.tensor(DType::f32, {s.b, s.hq, s.sq});
  a.out_b = mk.tensor(dt, {s.b, s.sq, s.hq, s.d});
  a.lse_b = mk.tensor(DType::f32, {s.b, s.hq, s.sq});
  a.out = (flags & 0x01) ? a.out_a : mk.tensor(dt, {s.b, s.sq, s.hq, s.d});
  if (flags & 0x08) a.lse = (flags & 0x02) ? a.lse_b : mk.tensor(DType::f32, {s.b, s.hq, s.sq});
  merge_states(a);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  const uint8_t op = in.u8();
  const uint8_t flags = in.u8();
  static constexpr DType dtypes[] = {DType::f32,  DType::f16,      DType::bf16, DType::f64,
                                     DType::e4m3, DType::e4m3fnuz, DType::e5m2};
  const DType dt = in.pick(dtypes);
  try {
    const Sizes s(in);
    Arena arena;
    Maker mk(in, arena);
    switch (op % 4) {
      case 0:
        run_forward(in, mk, s, dt, flags);
        break;
      case 1:
        run_backward(in, mk, s, dt, flags);
        break;
      case 2:
        run_kvcache(in, mk, s, dt, flags);
        break;
      default:
        run_merge(in, mk, s, dt, flags);
        break;
    }
  } catch (const Skip&) {
    return -1;  // not added to the corpus
  } catch (const Error& e) {
    // Rejected with a named argument: the expected outcome for most mutated inputs.
    if (verbose()) std::fprintf(stderr, "rejected: %s\n", e.what());
  }
  return 0;
}
