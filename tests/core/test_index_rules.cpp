// The device's index rules (core/index_rules.h, run by index_check.cu) against host validation: for random
// index tensors, valid and broken, the rules find a fault exactly when validation refuses the same values
// on the host, and name the same tensor. The rules are plain inline functions, so they run here as they
// run on the GPU; the fault record's host side (raise_recorded_fault) is checked at the end.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/test_util.hpp"
#include "core/index_fault.hpp"
#include "flashport/attention.hpp"

namespace flashport::test {
namespace {

constexpr int64_t kHq = 2, kHk = 1, kD = 8;

/// What a call's index tensors are, as the device rules read them.
struct Indices {
  std::vector<int32_t> cu_q, cu_k, used, leftpad, batch_idx, table;
  int64_t batch = 0, sq = 0, sk = 0, total_q = 0, total_k = 0, s_new = 0, kv_rows = 0, page = 0, columns = 0;
  bool paged = false;
};

/// The device rules over every sequence, in index_check.cu's order within a sequence; the first fault.
std::optional<std::string> rules_fault(const Indices& x, bool kv_cache) {
  AttnProblem p{};
  p.batch = x.batch, p.sq = x.sq, p.sk = x.sk, p.total_q = x.total_q, p.total_k = x.total_k;
  p.cu_seqlens_q = x.cu_q.empty() ? nullptr : x.cu_q.data();
  p.cu_seqlens_k = x.cu_k.empty() ? nullptr : x.cu_k.data();
  p.seqused_k = x.used.empty() ? nullptr : x.used.data();
  p.seqused_k_add = x.s_new;
  p.leftpad_k = x.leftpad.empty() ? nullptr : x.leftpad.data();
  p.kv_batch_idx = x.batch_idx.empty() ? nullptr : x.batch_idx.data();
  p.kv_rows = x.kv_rows;
  if (x.paged) p.block_table = x.table.data(), p.block_table_stride = x.columns, p.page_size = x.page;
  for (int64_t b = 0; b < x.batch; ++b) {
    IndexFault f = sequence_fault(p, b, kv_cache);
    if (f.kind == kFaultNone && p.block_table) {
      const int64_t columns = block_table_columns(p, b);
      EXPECT_LE(columns, x.columns) << "a fault-free sequence uses at most the table's columns";
      for (int64_t c = 0; c < columns && f.kind == kFaultNone; ++c) f = block_table_fault(p, b, c);
    }
    if (f.kind != kFaultNone) return core::describe_fault(f, kv_cache ? kCallKvCache : kCallForward).argument;
  }
  return std::nullopt;
}

/// The block table of `x` as a (batch, columns) int32 tensor.
HostTensor table_tensor(const Indices& x) {
  HostTensor t = int_tensor(x.table);
  t.tv.ndim = 2, t.tv.shape[0] = x.batch, t.tv.shape[1] = x.columns;
  t.tv.stride[0] = x.columns, t.tv.stride[1] = 1;
  return t;
}

/// Validation's verdict: the argument its Error names, or nothing when the call ran.
template <class Call>
std::optional<std::string> host_fault(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.argument();
  }
  return std::nullopt;
}

/// cu_seqlens and max_seqlen describe one tensor; a broken cu_seqlens may be named by either.
std::string group(const std::string& arg) {
  if (arg == "max_seqlen_q") return "cu_seqlens_q";
  if (arg == "max_seqlen_k") return "cu_seqlens_k";
  return arg;
}

/// Whether two names may report the same single broken tensor: validation checks one tensor over every
/// sequence before the next, the device every tensor of one sequence before the next, so a shortened
/// cu_seqlens_k sequence may first show as a seqused_k entry past its end.
bool same_cause(const std::string& host, const std::string& rules) {
  const std::string a = group(host), b = group(rules);
  return a == b || (a == "cu_seqlens_k" && b == "seqused_k") || (a == "seqused_k" && b == "cu_seqlens_k");
}

/// The case's index tensors and sizes, for a failure message that can be replayed by hand.
std::string describe(const Indices& x) {
  const auto list = [](const char* name, const std::vector<int32_t>& v) {
    std::string s = std::string(" ") + name + "=[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
    return s + "]";
  };
  return "batch=" + std::to_string(x.batch) + " sq=" + std::to_string(x.sq) + " sk=" + std::to_string(x.sk) +
         " total_q=" + std::to_string(x.total_q) + " total_k=" + std::to_string(x.total_k) +
         " s_new=" + std::to_string(x.s_new) + " kv_rows=" + std::to_string(x.kv_rows) +
         " page=" + std::to_string(x.page) + " columns=" + std::to_string(x.columns) + list("cu_q", x.cu_q) +
         list("cu_k", x.cu_k) + list("used", x.used) + list("leftpad", x.leftpad) +
         list("batch_idx", x.batch_idx) + list("table", x.table);
}

std::vector<int32_t> cumulative(const std::vector<int64_t>& lens) {
  std::vector<int32_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + (int32_t)n);
  return cu;
}

struct Rng {
  std::mt19937_64 gen{std::random_device{}()};
  int64_t in(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
  bool chance(double p) { return std::bernoulli_distribution(p)(gen); }
  /// Breaks one entry of `v` (an index tensor) by a small or out-of-range amount; false when empty.
  bool perturb(std::vector<int32_t>& v) {
    if (v.empty()) return false;
    const size_t i = (size_t)in(0, (int64_t)v.size() - 1);
    const int32_t deltas[] = {-7, -3, -1, 1, 2, 5};
    v[i] += deltas[in(0, 5)];
    return true;
  }
};

/// Breaks nothing (30% of calls), one tensor or three times one: each of `targets` is a name and a
/// breaker that reports whether it changed anything. Returns the names broken.
std::vector<std::string> break_some(
    Rng& r, const std::vector<std::pair<std::string, std::function<bool()>>>& targets) {
  std::vector<std::string> broken;
  const int breaks = r.chance(0.3) ? 0 : r.chance(0.7) ? 1 : 3;
  for (int i = 0; i < breaks; ++i) {
    const auto& [name, breaker] = targets[(size_t)r.in(0, (int64_t)targets.size() - 1)];
    if (breaker()) broken.push_back(name);
  }
  return broken;
}

/// Varlen forward, packed or paged K/V, with or without seqused_k.
void varlen_case(Rng& r, int& faults, int& cases) {
  Indices x;
  x.batch = r.in(1, 4);
  x.paged = r.chance(0.5);
  std::vector<int64_t> lq, lk;
  for (int64_t b = 0; b < x.batch; ++b) lq.push_back(r.in(0, 5)), lk.push_back(r.in(0, 6));
  x.cu_q = cumulative(lq), x.cu_k = cumulative(lk);
  x.sq = *std::max_element(lq.begin(), lq.end()) + r.in(0, 1);
  x.sk = *std::max_element(lk.begin(), lk.end()) + r.in(0, 1);
  x.total_q = x.cu_q.back();
  if (x.paged) {
    x.page = r.in(1, 4), x.columns = std::max<int64_t>(1, (x.sk + x.page - 1) / x.page + r.in(0, 1)),
    x.kv_rows = r.in(1, 6);
    for (int64_t i = 0; i < x.batch * x.columns; ++i) x.table.push_back((int32_t)r.in(0, x.kv_rows - 1));
  } else {
    x.total_k = x.cu_k.back();
  }
  if (r.chance(0.4))
    for (int64_t b = 0; b < x.batch; ++b) x.used.push_back((int32_t)r.in(0, lk[(size_t)b]));
  const std::vector<std::string> broken =
      break_some(r, {{"cu_seqlens_q", [&] { return r.perturb(x.cu_q); }},
                     {"cu_seqlens_k", [&] { return r.perturb(x.cu_k); }},
                     {"seqused_k", [&] { return r.perturb(x.used); }},
                     {"block_table", [&] { return x.paged && r.perturb(x.table); }}});
  HostTensor q = randn(DType::f32, {x.total_q, kHq, kD}), out(DType::f32, {x.total_q, kHq, kD});
  const int64_t rows = x.paged ? x.kv_rows : x.total_k;
  HostTensor k = x.paged ? randn(DType::f32, {rows, x.page, kHk, kD}) : randn(DType::f32, {rows, kHk, kD});
  HostTensor v = k;
  HostTensor cu_q = int_tensor(x.cu_q), cu_k = int_tensor(x.cu_k), used, table;
  ForwardArgs a;
  a.q = q, a.k = k, a.v = v, a.out = out;
  a.layout.cu_seqlens_q = cu_q.view(), a.layout.cu_seqlens_k = cu_k.view();
  a.layout.max_seqlen_q = x.sq, a.layout.max_seqlen_k = x.sk;
  if (!x.used.empty()) used = int_tensor(x.used), a.layout.seqused_k = used.view();
  if (x.paged) {
    table = table_tensor(x);
    a.layout.block_table = table.view();
  }
  const auto host = host_fault([&] { forward(a); });
  const auto rules = rules_fault(x, false);
  ASSERT_EQ(host.has_value(), rules.has_value())
      << "host: " << host.value_or("-") << ", rules: " << rules.value_or("-") << ", broken " << broken.size()
      << "; " << describe(x);
  if (host && broken.size() == 1) EXPECT_TRUE(same_cause(*host, *rules)) << *host << " vs " << *rules;
  faults += host.has_value(), ++cases;
}

/// flash_attn_with_kvcache: dense (optionally through cache_batch_idx, with left pads) or paged, with or
/// without appended tokens.
void kvcache_case(Rng& r, int& faults, int& cases) {
  Indices x;
  x.batch = r.in(1, 4);
  x.paged = r.chance(0.4);
  x.s_new = r.in(0, 2);
  const int64_t sq = r.in(1, 2);
  int64_t capacity;
  if (x.paged) {
    x.page = r.in(1, 4), x.columns = r.in(1, 3), x.kv_rows = r.in(1, 6);
    capacity = x.page * x.columns;
    for (int64_t i = 0; i < x.batch * x.columns; ++i) x.table.push_back((int32_t)r.in(0, x.kv_rows - 1));
  } else {
    capacity = r.in(2, 8);
    x.kv_rows = x.batch + r.in(0, 2);
  }
  x.sk = capacity;
  if (x.s_new > capacity) x.s_new = capacity;
  for (int64_t b = 0; b < x.batch; ++b) x.used.push_back((int32_t)r.in(0, capacity - x.s_new));
  const bool batch_idx = !x.paged && r.chance(0.4), leftpad = !x.paged && r.chance(0.4);
  for (int64_t b = 0; batch_idx && b < x.batch; ++b) x.batch_idx.push_back((int32_t)r.in(0, x.kv_rows - 1));
  for (int64_t b = 0; leftpad && b < x.batch; ++b)
    x.leftpad.push_back((int32_t)r.in(0, x.used[(size_t)b] + x.s_new));
  // Only columns a sequence uses: validation checks every column of a paged cache's table (it knows no
  // lengths when it does), the device only the used ones, as the kernels read them.
  const auto break_used_page = [&] {
    if (!x.paged) return false;
    const int64_t b = r.in(0, x.batch - 1);
    const int64_t tokens = std::clamp<int64_t>(x.used[(size_t)b] + x.s_new, 0, capacity);
    const int64_t used = (tokens + x.page - 1) / x.page;  // cache_seqlens may be broken already
    if (used == 0) return false;
    x.table[(size_t)(b * x.columns + r.in(0, used - 1))] +=
        r.chance(0.5) ? -(int32_t)x.kv_rows - 1 : (int32_t)x.kv_rows;
    return true;
  };
  const std::vector<std::string> broken =
      break_some(r, {{"cache_seqlens", [&] { return r.perturb(x.used); }},
                     {"cache_batch_idx", [&] { return r.perturb(x.batch_idx); }},
                     {"cache_leftpad", [&] { return r.perturb(x.leftpad); }},
                     {"block_table", break_used_page}});
  const int64_t cache_rows = x.paged ? x.kv_rows : batch_idx ? x.kv_rows : x.batch;
  const int64_t cache_len = x.paged ? x.page : capacity;
  HostTensor q = randn(DType::f32, {x.batch, sq, kHq, kD}), out(DType::f32, {x.batch, sq, kHq, kD});
  HostTensor kc = randn(DType::f32, {cache_rows, cache_len, kHk, kD}), vc = kc;
  HostTensor kn = randn(DType::f32, {x.batch, x.s_new, kHk, kD}), vn = kn;
  HostTensor seqlens = int_tensor(x.used), idx, pad, table;
  KvCacheArgs a;
  a.q = q, a.k_cache = kc, a.v_cache = vc, a.out = out, a.cache_seqlens = seqlens.view();
  if (x.s_new > 0) a.k_new = kn.view(), a.v_new = vn.view();
  if (batch_idx) idx = int_tensor(x.batch_idx), a.cache_batch_idx = idx.view();
  if (leftpad) pad = int_tensor(x.leftpad), a.cache_leftpad = pad.view();
  if (x.paged) {
    table = table_tensor(x);
    a.block_table = table.view();
  }
  const auto host = host_fault([&] { forward_kvcache(a); });
  const auto rules = rules_fault(x, true);
  ASSERT_EQ(host.has_value(), rules.has_value())
      << "host: " << host.value_or("-") << ", rules: " << rules.value_or("-") << ", broken " << broken.size();
  if (host && broken.size() == 1) EXPECT_EQ(*host, *rules);
  faults += host.has_value(), ++cases;
}

TEST(IndexRules, AgreeWithHostValidationOnVarlenCalls) {
  Rng r;
  int faults = 0, cases = 0;
  for (int i = 0; i < 1500 && !HasFatalFailure(); ++i) varlen_case(r, faults, cases);
  EXPECT_GT(faults, cases / 5) << "the generator must break a good share of the calls";
  EXPECT_LT(faults, cases) << "and leave some valid";
}

TEST(IndexRules, AgreeWithHostValidationOnKvCacheCalls) {
  Rng r;
  int faults = 0, cases = 0;
  for (int i = 0; i < 1500 && !HasFatalFailure(); ++i) kvcache_case(r, faults, cases);
  EXPECT_GT(faults, cases / 5);
  EXPECT_LT(faults, cases);
}

TEST(IndexRules, RecordedFaultRaisesOnceWithItsName) {
  FaultRecord record{};
  core::raise_recorded_fault(&record, "cuda:0");  // empty: nothing
  core::raise_recorded_fault(nullptr, "cuda:0");
  record.call = kCallKvCache, record.batch = 0, record.entry = 0, record.value = 64, record.bound = 64;
  record.claim = 1;
  record.kind = kFaultCacheCapacity;
  try {
    core::raise_recorded_fault(&record, "cuda:3");
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "cache_seqlens");
    const std::string text = e.what();
    for (const char* part :
         {"entry 0 = 64", "capacity 64", "block_table", "cuda:3", "earlier forward_kvcache"})
      EXPECT_NE(text.find(part), std::string::npos) << text << " lacks " << part;
  }
  EXPECT_EQ(record.kind, kFaultNone);
  EXPECT_EQ(record.claim, 0) << "cleared, so the next fault can be recorded";
  core::raise_recorded_fault(&record, "cuda:3");  // raised once only
  for (int kind = kFaultNone + 1; kind < kFaultKinds; ++kind) {
    const core::FaultText t = core::describe_fault({kind, 1, 2, 3, 4}, kCallForward);
    EXPECT_NE(t.argument, "device fault record") << "kind " << kind << " has no message";
    EXPECT_FALSE(t.message.empty());
  }
}

TEST(IndexRules, DeviceFaultRecordsAndTheCheckLaunch) {
  // What both GPU launchers share: a device's record is polled only once published, the label names the
  // backend and device, devices outside the table have none.
  core::DeviceFaultRecords records;
  FaultRecord record{};
  EXPECT_EQ(records.get(2), nullptr);
  records.raise(2, "hip");  // nothing published: nothing to raise
  records.publish(2, &record);
  records.publish(-1, &record), records.publish(1 << 20, &record);  // ignored
  EXPECT_EQ(records.get(2), &record);
  EXPECT_EQ(records.get(-1), nullptr);
  EXPECT_EQ(records.get(1 << 20), nullptr);
  records.raise(2, "hip");  // published but clean
  record.call = kCallForward, record.batch = 1, record.entry = 5, record.value = 99, record.bound = 40;
  record.kind = kFaultBlockTable;
  try {
    records.raise(2, "hip");
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "block_table");
    EXPECT_NE(std::string(e.what()).find("hip:2"), std::string::npos) << e.what();
  }

  // The check runs only for calls with index tensors and sequences, outside checked mode; its grid y covers
  // the block table's columns a sequence can use, in groups, clamped to the grid limit.
  const bool was_checked = flashport::checked_mode();
  flashport::set_checked_mode(false);
  AttnProblem p{};
  p.batch = 3, p.sk = 1000;
  EXPECT_FALSE(core::wants_device_check(p));
  const int ids[1] = {0};
  p.seqused_k = ids;
  EXPECT_TRUE(core::wants_device_check(p));
  flashport::set_checked_mode(true);  // the host reads the indices itself
  EXPECT_FALSE(core::wants_device_check(p));
  flashport::set_checked_mode(was_checked);
  p.batch = 0;
  EXPECT_FALSE(core::wants_device_check(p));
  p.batch = 3;
  EXPECT_EQ(core::index_check_chunks(p, 256, 65535), 1) << "no block table";
  p.block_table = ids, p.page_size = 1;  // 1000 columns
  EXPECT_EQ(core::index_check_chunks(p, 256, 65535), 4);
  EXPECT_EQ(core::index_check_chunks(p, 256, 3), 3);
  p.page_size = 16;  // 63 columns
  EXPECT_EQ(core::index_check_chunks(p, 256, 65535), 1);
  p.sk = 0;
  EXPECT_EQ(core::index_check_chunks(p, 256, 65535), 1);
}

}  // namespace
}  // namespace flashport::test
