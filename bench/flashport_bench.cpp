// flashport_bench: the CPU speed grid of shared/BENCH.md scaled to a small machine. Times the fast path
// (median of repeats after a warm-up), checks each timed configuration once against the reference on a
// slice, prints progress and writes one JSON line per row (peer fields null: bench/peer_torch.py fills them).
// --decode runs the decode grid instead: flash_attn_with_kvcache's one query token per sequence over a full
// cache (GQA 32/8, d 128 by default), batch x context x dtype.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/fast.hpp"
#include "bench_util.hpp"
#include "flashport/flashport.hpp"

namespace {

using bench::max_abs;
using bench::max_diff;
using flashport::DType;
using flashport::Impl;
using flashport::TensorView;

struct Options {
  std::string out = "flashport_bench.jsonl";
  int reps = 5;
  int64_t tokens = 4096;  // batch * seqlen
  int64_t hidden = 512;   // nheads * headdim
  std::vector<int64_t> seqlens{512, 1024, 2048, 4096};
  std::vector<int64_t> dims{64, 128};
  std::vector<std::string> dtypes{"f32", "bf16"};
  std::vector<std::string> modes{"fwd", "fwd+bwd"};
  std::vector<bool> causal{false, true};
  bool check = true;  // the once-per-row correctness check against the reference
  // --decode: the decode grid (forward_kvcache, one query token, full caches).
  bool decode = false;
  std::vector<int64_t> batches{1, 2, 4, 8};
  std::vector<int64_t> contexts{1024, 8192, 32768};
  int64_t hq = 32, hk = 8, page = 0;  // page 0: dense (b, context, hk, d) caches
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) parts.push_back(item);
  return parts;
}

std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> v;
  for (const std::string& p : split(s)) v.push_back(std::stoll(p));
  return v;
}

void usage() {
  std::puts(
      "usage: flashport_bench [--out PATH] [--reps N] [--tokens N] [--hidden N] [--seqlens a,b]\n"
      "                       [--dims a,b] [--dtypes f32,bf16,f16] [--modes fwd,fwd+bwd] [--causal 0|1]\n"
      "                       [--no-check] [--quick]\n"
      "       flashport_bench --decode [--batches 1,8] [--contexts 1024,32768] [--heads 32,8] [--page N]\n"
      "                       [--dims 128] [--dtypes f32,bf16] [--reps N] [--out PATH] [--no-check]\n"
      "Times the CPU fast path on batch*seqlen = tokens, nheads*headdim = hidden; one JSON line per row.\n"
      "--decode: flash_attn_with_kvcache with one query token over full caches of each context (dense, or\n"
      "paged with --page N), batch x context x dtype; --dims defaults to 128 there.\n"
      "Each line records this executable (\"driver\") and its row arguments (\"rerun\") so that\n"
      "bench/peer_torch.py can re-time a row next to its peer.");
}

Options parse(int argc, char** argv) {
  Options o;
  bool dims_given = false;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    auto value = [&]() -> std::string {
      if (a + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++a];
    };
    if (arg == "--out") {
      o.out = value();
    } else if (arg == "--reps") {
      o.reps = std::max(1, std::stoi(value()));
    } else if (arg == "--tokens") {
      o.tokens = std::stoll(value());
    } else if (arg == "--hidden") {
      o.hidden = std::stoll(value());
    } else if (arg == "--seqlens") {
      o.seqlens = split_ints(value());
    } else if (arg == "--dims") {
      o.dims = split_ints(value());
      dims_given = true;
    } else if (arg == "--dtypes") {
      o.dtypes = split(value());
    } else if (arg == "--modes") {
      o.modes = split(value());
    } else if (arg == "--causal") {
      o.causal = {value() != "0"};
    } else if (arg == "--decode") {
      o.decode = true;
    } else if (arg == "--batches") {
      o.batches = split_ints(value());
    } else if (arg == "--contexts") {
      o.contexts = split_ints(value());
    } else if (arg == "--heads") {
      const std::vector<int64_t> h = split_ints(value());
      o.hq = h.at(0), o.hk = h.size() > 1 ? h[1] : h[0];
    } else if (arg == "--page") {
      o.page = std::stoll(value());
    } else if (arg == "--no-check") {
      o.check = false;
    } else if (arg == "--quick") {
      o.seqlens = {512, 1024};
      o.reps = 3;
      o.modes = {"fwd"};
      o.dtypes = {"f32"};
    } else {
      usage();
      std::exit(arg == "--help" || arg == "-h" ? 0 : 2);
    }
  }
  if (o.decode && !dims_given) o.dims = {128};
  return o;
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::f32;
  if (s == "bf16") return DType::bf16;
  if (s == "f16") return DType::f16;
  std::fprintf(stderr, "unknown dtype %s (f32, bf16, f16)\n", s.c_str());
  std::exit(2);
}

/// An owned contiguous (b, s, h, d) buffer of fresh normal values.
struct Buffer {
  std::vector<unsigned char> bytes;
  TensorView tv;
  Buffer(DType dtype, int64_t b, int64_t s, int64_t h, int64_t d, std::mt19937_64* gen)
      : bytes((size_t)(b * s * h * d * flashport::dtype_size(dtype))) {
    tv = TensorView::contiguous(bytes.data(), dtype, {b, s, h, d});
    if (!gen) return;
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> values((size_t)(b * s * h * d));
    for (float& v : values) v = nd(*gen);
    flashport::cast(TensorView::contiguous(values.data(), DType::f32, {b, s, h, d}), tv);
  }
  /// Rows [r0, r0 + rows) and heads [0, heads) of batch 0, as a (1, rows, heads, d) view.
  TensorView slice(int64_t r0, int64_t rows, int64_t heads) const {
    TensorView v = tv;
    v.data = (unsigned char*)tv.data + r0 * tv.stride[1] * flashport::dtype_size(tv.dtype);
    v.shape = {1, rows, heads, tv.shape[3]};
    return v;
  }
};

template <class F>
double median_ms(int reps, F&& body) {
  body();  // warm-up: page faults, thread pool start
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// SPEC.md's FLOP model: 2 * visible pairs * (d + dv) * hq per sequence, times 2.5 for the backward.
double forward_flops(int64_t b, int64_t h, int64_t s, int64_t d, bool causal) {
  const double pairs = causal ? (double)s * (double)(s + 1) / 2.0 : (double)s * (double)s;
  return 2.0 * pairs * (double)(2 * d) * (double)(h * b);
}

struct Row {
  std::string mode, dtype;
  int64_t b, h, d, s;
  bool causal, pass;
  double max_err, ms, gflops;
};

/// One timed configuration; correctness on the last `rows` query rows of heads 0-1 of batch 0 (the
/// bottom-right alignment keeps those rows' masks identical to the full problem's).
Row run_config(const Options& o, const std::string& mode, const std::string& dtype_name, int64_t d, int64_t s,
               bool causal, std::mt19937_64& gen) {
  const DType dtype = parse_dtype(dtype_name);
  const int64_t h = std::max<int64_t>(1, o.hidden / d), b = std::max<int64_t>(1, o.tokens / s);
  Buffer q(dtype, b, s, h, d, &gen), k(dtype, b, s, h, d, &gen), v(dtype, b, s, h, d, &gen);
  Buffer out(dtype, b, s, h, d, nullptr);
  std::vector<float> lse((size_t)(b * h * s));

  flashport::ForwardArgs fa;
  fa.q = q.tv, fa.k = k.tv, fa.v = v.tv, fa.out = out.tv;
  fa.lse = TensorView::contiguous(lse.data(), DType::f32, {b, h, s});
  fa.options.causal = causal;
  fa.impl = Impl::fast;

  const bool backward = mode == "fwd+bwd";
  Buffer dout(dtype, b, s, h, d, backward ? &gen : nullptr), dq(dtype, b, s, h, d, nullptr),
      dk(dtype, b, s, h, d, nullptr), dvg(dtype, b, s, h, d, nullptr);
  flashport::BackwardArgs ba;
  ba.dout = dout.tv, ba.q = q.tv, ba.k = k.tv, ba.v = v.tv, ba.out = out.tv, ba.lse = fa.lse.value();
  ba.dq = dq.tv, ba.dk = dk.tv, ba.dv = dvg.tv;
  ba.options.causal = causal;
  ba.impl = Impl::fast;

  Row row{mode, dtype_name, b, h, d, s, causal, false, 0.0, 0.0, 0.0};
  row.ms = median_ms(o.reps, [&] {
    flashport::forward(fa);
    if (backward) flashport::backward(ba);
  });
  const double flops = forward_flops(b, h, s, d, causal) * (backward ? 3.5 : 1.0);
  row.gflops = flops / row.ms / 1e6;

  if (!o.check) {
    row.pass = true;
    row.max_err = 0.0;
    return row;
  }
  // Correctness of the timed configuration, once: the reference (and, for the accuracy rule, the
  // baseline) on the slice. dQ rows depend only on their own query rows, so the slice's reference
  // backward gives exactly the full problem's dQ there; dK/dV would need every row and are skipped.
  const int64_t rows = std::min<int64_t>(s, 48), heads = std::min<int64_t>(h, 2), r0 = s - rows;
  Buffer ref_out(dtype, 1, rows, heads, d, nullptr), base_out(dtype, 1, rows, heads, d, nullptr);
  std::vector<float> ref_lse((size_t)(heads * rows));
  flashport::ForwardArgs sa;
  sa.q = q.slice(r0, rows, heads), sa.k = k.slice(0, s, heads), sa.v = v.slice(0, s, heads);
  sa.options.causal = causal;
  sa.out = ref_out.tv;
  sa.lse = TensorView::contiguous(ref_lse.data(), DType::f32, {1, heads, rows});
  sa.impl = Impl::reference;
  flashport::forward(sa);
  sa.out = base_out.tv;
  sa.lse.reset();
  sa.impl = Impl::baseline;
  flashport::forward(sa);
  const double err = max_diff(out.slice(r0, rows, heads), ref_out.tv);
  const double base_err = max_diff(base_out.tv, ref_out.tv);
  row.max_err = err;
  row.pass = err <= 2.0 * base_err + 1e-5;
  if (backward) {
    Buffer ref_dq(dtype, 1, rows, heads, d, nullptr), ref_dk(dtype, 1, s, heads, d, nullptr),
        ref_dv(dtype, 1, s, heads, d, nullptr);
    flashport::BackwardArgs sb;
    sb.dout = dout.slice(r0, rows, heads), sb.q = sa.q, sb.k = sa.k, sb.v = sa.v;
    sb.out = out.slice(r0, rows, heads);
    // The timed run's LSE rows of the slice, (b=0, h, r0 + i), copied contiguous.
    std::vector<float> slice_lse((size_t)(heads * rows));
    for (int64_t hh = 0; hh < heads; ++hh)
      std::copy_n(lse.data() + hh * s + r0, rows, slice_lse.data() + hh * rows);
    sb.lse = TensorView::contiguous(slice_lse.data(), DType::f32, {1, heads, rows});
    sb.dq = ref_dq.tv, sb.dk = ref_dk.tv, sb.dv = ref_dv.tv;
    sb.options.causal = causal;
    sb.impl = Impl::reference;
    flashport::backward(sb);
    // Same bound as tests/cpu/test_fast_backward.cpp: 3 rounding steps of the dtype relative to max|dQ|.
    const double step = dtype == DType::bf16 ? 0x1p-8 : dtype == DType::f16 ? 0x1p-11 : 0x1p-17;
    const double dq_err = max_diff(dq.slice(r0, rows, heads), ref_dq.tv);
    row.max_err = std::max(row.max_err, dq_err);
    row.pass = row.pass && dq_err <= 3.0 * step * max_abs(ref_dq.tv) + 1e-5;
  }
  return row;
}

/// This executable's absolute path (so a peer script can re-run single rows), or argv[0].
std::string self_path(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, (size_t)n) : std::string(argv0);
}

std::string json(const Row& r, int threads, const std::string& isa, const Options& o,
                 const std::string& driver) {
  char buf[1024];
  std::snprintf(
      buf, sizeof buf,
      "{\"backend\": \"cpu\", \"impl\": \"fast\", \"peer\": null, \"mode\": \"%s\", \"dtype\": \"%s\", "
      "\"b\": %lld, \"hq\": %lld, \"d\": %lld, \"sq\": %lld, \"sk\": %lld, \"causal\": %s, \"pass\": %s, "
      "\"max_err\": %.3g, \"ms\": %.4f, \"tflops\": %.6f, \"peer_ms\": null, \"peer_tflops\": null, "
      "\"threads\": %d, \"isa\": \"%s\", \"driver\": \"%s\", \"rerun\": [\"--modes\", \"%s\", "
      "\"--dtypes\", \"%s\", \"--dims\", \"%lld\", \"--seqlens\", \"%lld\", \"--causal\", \"%d\", "
      "\"--tokens\", \"%lld\", \"--hidden\", \"%lld\", \"--reps\", \"%d\", \"--no-check\"]}",
      r.mode.c_str(), r.dtype.c_str(), (long long)r.b, (long long)r.h, (long long)r.d, (long long)r.s,
      (long long)r.s, r.causal ? "true" : "false", r.pass ? "true" : "false", r.max_err, r.ms, r.gflops / 1e3,
      threads, isa.c_str(), driver.c_str(), r.mode.c_str(), r.dtype.c_str(), (long long)r.d, (long long)r.s,
      r.causal ? 1 : 0, (long long)o.tokens, (long long)o.hidden, o.reps);
  return buf;
}

// ---------------------------------------------------------------------------------------------
// The decode grid (--decode).

/// Fills `t` (any float dtype) with approximately normal values (Irwin-Hall: a sum of four uniforms,
/// rescaled), in parallel: the caches of the largest rows hold half a billion values, which
/// std::normal_distribution would take tens of seconds to draw.
void fill_fast(const TensorView& t, uint64_t seed) {
  const int64_t n = t.numel();
  std::vector<float> values((size_t)n);
#pragma omp parallel
  {
    uint64_t state = seed ^ (0x9E3779B97F4A7C15ULL * (uint64_t)(omp_get_thread_num() + 1));
    auto next = [&] {  // splitmix64
      uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
      return z ^ (z >> 31);
    };
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t r = next();
      float sum = 0.0f;
      for (int u = 0; u < 4; ++u) sum += (float)((r >> (16 * u)) & 0xffff) * (1.0f / 65536.0f);
      values[(size_t)i] = (sum - 2.0f) * 1.7320508f;  // mean 0, variance 4/12 -> 1
    }
  }
  TensorView src = t;
  src.data = values.data();
  src.dtype = DType::f32;
  flashport::cast(src, t);
}

struct DecodeRow {
  std::string dtype;
  int64_t b, ctx, d;
  bool pass;
  double max_err, ms;
};

/// One decode configuration: forward_kvcache with one query token per sequence over caches filled to
/// `ctx` (nothing appended). Checked once against the reference and baseline on batch entry 0.
DecodeRow run_decode(const Options& o, const std::string& dtype_name, int64_t d, int64_t b, int64_t ctx,
                     std::mt19937_64& gen) {
  const DType dtype = parse_dtype(dtype_name);
  const int64_t hq = o.hq, hk = o.hk, page = o.page;
  const int64_t per_seq = page > 0 ? (ctx + page - 1) / page : 0, blocks = b * per_seq;
  Buffer q(dtype, b, 1, hq, d, nullptr), out(dtype, b, 1, hq, d, nullptr);
  Buffer k(dtype, page > 0 ? blocks : b, page > 0 ? page : ctx, hk, d, nullptr);
  Buffer v(dtype, page > 0 ? blocks : b, page > 0 ? page : ctx, hk, d, nullptr);
  fill_fast(q.tv, gen());
  fill_fast(k.tv, gen());
  fill_fast(v.tv, gen());
  std::vector<float> lse((size_t)(b * hq));
  std::vector<int32_t> seqlens((size_t)b, (int32_t)ctx), table((size_t)blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), gen);  // pages scattered through the pool

  flashport::KvCacheArgs a;
  a.q = q.tv, a.k_cache = k.tv, a.v_cache = v.tv, a.out = out.tv;
  a.lse = TensorView::contiguous(lse.data(), DType::f32, {b, hq, 1});
  a.cache_seqlens = TensorView::contiguous(seqlens.data(), DType::i32, {b});
  if (page > 0) a.block_table = TensorView::contiguous(table.data(), DType::i32, {b, per_seq});
  a.impl = Impl::fast;

  DecodeRow row{dtype_name, b, ctx, d, false, 0.0, 0.0};
  row.ms = median_ms(o.reps, [&] { flashport::forward_kvcache(a); });
  if (!o.check) {
    row.pass = true;
    return row;
  }
  // Batch entry 0 alone (its q rows, cache row or block-table row) through the reference and the
  // baseline; the fast output's batch 0 must meet the accuracy rule against them.
  Buffer ref_out(dtype, 1, 1, hq, d, nullptr), base_out(dtype, 1, 1, hq, d, nullptr);
  flashport::KvCacheArgs s = a;
  s.q = q.slice(0, 1, hq);
  if (page > 0) {
    s.block_table = TensorView::contiguous(table.data(), DType::i32, {1, per_seq});
  } else {
    s.k_cache = k.slice(0, ctx, hk), s.v_cache = v.slice(0, ctx, hk);
  }
  s.cache_seqlens = TensorView::contiguous(seqlens.data(), DType::i32, {1});
  s.lse.reset();
  s.out = ref_out.tv;
  s.impl = Impl::reference;
  flashport::forward_kvcache(s);
  s.out = base_out.tv;
  s.impl = Impl::baseline;
  flashport::forward_kvcache(s);
  row.max_err = max_diff(out.slice(0, 1, hq), ref_out.tv);
  row.pass = row.max_err <= 2.0 * max_diff(base_out.tv, ref_out.tv) + 1e-5;
  return row;
}

std::string decode_json(const DecodeRow& r, const Options& o, int threads, const std::string& isa,
                        const std::string& driver) {
  const double bytes = 2.0 * (double)(r.b * r.ctx * o.hk * r.d) * (r.dtype == "f32" ? 4.0 : 2.0);
  const double flops = 4.0 * (double)(r.b * o.hq * r.ctx * r.d);  // SPEC: 4 * b * hq * sq * sk * d
  char buf[1400];
  std::snprintf(
      buf, sizeof buf,
      "{\"backend\": \"cpu\", \"impl\": \"fast\", \"peer\": null, \"mode\": \"decode\", \"dtype\": \"%s\", "
      "\"b\": %lld, \"hq\": %lld, \"hk\": %lld, \"d\": %lld, \"sq\": 1, \"sk\": %lld, \"page\": %lld, "
      "\"causal\": false, \"pass\": %s, \"max_err\": %.3g, \"ms\": %.4f, \"tflops\": %.6f, \"gbs\": %.3f, "
      "\"peer_ms\": null, \"peer_tflops\": null, \"threads\": %d, \"isa\": \"%s\", \"driver\": \"%s\", "
      "\"rerun\": [\"--decode\", \"--dtypes\", \"%s\", \"--dims\", \"%lld\", \"--batches\", \"%lld\", "
      "\"--contexts\", \"%lld\", \"--heads\", \"%lld,%lld\", \"--page\", \"%lld\", \"--reps\", \"%d\", "
      "\"--no-check\"]}",
      r.dtype.c_str(), (long long)r.b, (long long)o.hq, (long long)o.hk, (long long)r.d, (long long)r.ctx,
      (long long)o.page, r.pass ? "true" : "false", r.max_err, r.ms, flops / r.ms / 1e9, bytes / r.ms / 1e6,
      threads, isa.c_str(), driver.c_str(), r.dtype.c_str(), (long long)r.d, (long long)r.b, (long long)r.ctx,
      (long long)o.hq, (long long)o.hk, (long long)o.page, o.reps);
  return buf;
}

int run_decode_grid(const Options& o, std::FILE* out, int threads, const std::string& driver) {
  std::mt19937_64 gen(std::random_device{}());
  const int total = (int)(o.dtypes.size() * o.dims.size() * o.batches.size() * o.contexts.size());
  std::printf(
      "flashport_bench --decode: forward_kvcache, 1 query token, heads %lld/%lld, %s caches, %d threads, "
      "median of %d\n",
      (long long)o.hq, (long long)o.hk, o.page > 0 ? ("paged " + std::to_string(o.page)).c_str() : "dense",
      threads, o.reps);
  int n = 0, failures = 0;
  for (const std::string& dt : o.dtypes) {
    const std::string isa = flashport::cpu::fast::forward_isa((int)parse_dtype(dt), /*decode=*/true);
    std::printf("%s: the dispatcher runs the %s kernels\n", dt.c_str(), isa.c_str());
    for (int64_t d : o.dims) {
      for (int64_t b : o.batches) {
        for (int64_t ctx : o.contexts) {
          const DecodeRow r = run_decode(o, dt, d, b, ctx, gen);
          failures += r.pass ? 0 : 1;
          std::printf("[%2d/%d] decode %-4s d=%-3lld b=%-2lld ctx=%-6lld %9.3f ms  %s (err %.1e)\n", ++n,
                      total, dt.c_str(), (long long)d, (long long)b, (long long)ctx, r.ms,
                      r.pass ? "pass" : "FAIL", r.max_err);
          std::fflush(stdout);
          std::fprintf(out, "%s\n", decode_json(r, o, threads, isa, driver).c_str());
          std::fflush(out);
        }
      }
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const int threads = omp_get_max_threads();
  const std::string driver = self_path(argv[0]);
  std::FILE* out = std::fopen(o.out.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", o.out.c_str());
    return 2;
  }
  if (o.decode) {
    const int failures = run_decode_grid(o, out, threads, driver);
    std::fclose(out);
    std::printf("results: %s\n", o.out.c_str());
    return failures ? 1 : 0;
  }
  std::mt19937_64 gen(std::random_device{}());
  const int total =
      (int)(o.modes.size() * o.dtypes.size() * o.dims.size() * o.seqlens.size() * o.causal.size());
  std::printf("flashport_bench: CPU fast path, %d threads, %lld tokens, nheads*d = %lld, median of %d\n",
              threads, (long long)o.tokens, (long long)o.hidden, o.reps);
  int n = 0, failures = 0;
  for (const std::string& mode : o.modes) {
    for (const std::string& dt : o.dtypes) {
      const std::string isa = flashport::cpu::fast::forward_isa((int)parse_dtype(dt), /*decode=*/false);
      std::printf("%s %s: the dispatcher's forward runs the %s kernels\n", mode.c_str(), dt.c_str(),
                  isa.c_str());
      for (int64_t d : o.dims) {
        for (bool causal : o.causal) {
          for (int64_t s : o.seqlens) {
            const Row r = run_config(o, mode, dt, d, s, causal, gen);
            failures += r.pass ? 0 : 1;
            std::printf(
                "[%2d/%d] %-7s %-4s d=%-3lld s=%-5lld causal=%d  %9.2f ms  %7.1f GFLOPS  %s (err %.1e)\n",
                ++n, total, mode.c_str(), dt.c_str(), (long long)d, (long long)s, causal ? 1 : 0, r.ms,
                r.gflops, r.pass ? "pass" : "FAIL", r.max_err);
            std::fflush(stdout);
            std::fprintf(out, "%s\n", json(r, threads, isa, o, driver).c_str());
            std::fflush(out);
          }
        }
      }
    }
  }
  std::fclose(out);
  std::printf("results: %s\n", o.out.c_str());
  return failures ? 1 : 0;
}
