// Argument checks shared by every entry point.
#include "check.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "flashport/attention.hpp"

namespace flashport {

namespace {
std::atomic<bool> g_checked{false};
}  // namespace

void set_checked_mode(bool on) {
  g_checked.store(on, std::memory_order_relaxed);
}
bool checked_mode() {
  return g_checked.load(std::memory_order_relaxed);
}

void check_device(Device device) {
  if (const core::Backend* be = core::backend_for(device.type)) be->check_device(device.index);
}

}  // namespace flashport

namespace flashport::core {
namespace {

/// This thread's current call: its stream and the host copies checked mode made of device indices.
struct CallState {
  void* stream = nullptr;
  std::vector<std::pair<const void*, std::vector<int32_t>>> copies;
};
thread_local CallState t_call;

}  // namespace

void begin_call(void* stream) {
  t_call.stream = stream;
  t_call.copies.clear();
}

const int32_t* host_ints(const TensorView& t) {
  if (t.device.type == DeviceType::cpu) return static_cast<const int32_t*>(t.data);
  if (!checked_mode() || t.numel() == 0) return nullptr;
  for (const auto& [src, values] : t_call.copies)
    if (src == t.data && (int64_t)values.size() == t.numel()) return values.data();
  const Backend* be = backend_for(t.device.type);
  if (!be) return nullptr;  // the entry point reports the missing backend
  std::vector<int32_t> values((size_t)t.numel());
  be->copy_to_host(values.data(), t.data, values.size() * sizeof(int32_t), t_call.stream);
  t_call.copies.emplace_back(t.data, std::move(values));
  return t_call.copies.back().second.data();
}

std::string shape_text(std::initializer_list<int64_t> dims) {
  std::string s = "(";
  int i = 0;
  for (int64_t d : dims) s += (i++ ? ", " : "") + (d < 0 ? std::string("*") : std::to_string(d));
  if (dims.size() == 1) s += ",";
  return s + ")";
}

void check_tensor(const TensorView& t, const char* name, std::initializer_list<int64_t> shape,
                  std::initializer_list<DType> dtypes, const Device& device, bool last_contiguous) {
  bool shape_ok = t.ndim == (int)shape.size();
  int d = 0;
  for (int64_t want : shape) {
    if (shape_ok && want >= 0 && t.shape[d] != want) shape_ok = false;
    ++d;
  }
  require(shape_ok, name, [&] { return "expected shape " + shape_text(shape) + ", got " + t.describe(); });
  // Strides of a tensor with no elements address nothing (numpy and DLPack report 0 for them): only
  // non-empty tensors get stride checks.
  const bool empty = t.numel() == 0;
  for (int i = 0; i < t.ndim; ++i)
    require(t.shape[i] >= 0 && (empty || t.stride[i] >= 0), name,
            [&] { return "negative extents or strides are not supported, got " + t.describe(); });
  if (std::find(dtypes.begin(), dtypes.end(), t.dtype) == dtypes.end()) {
    std::string want;
    for (DType dt : dtypes) want += (want.empty() ? "" : " or ") + std::string(dtype_name(dt));
    throw Error(name, std::string("expected dtype ") + want + ", got " + dtype_name(t.dtype));
  }
  require(t.device == device, name, [&] {
    return std::string("expected device ") + device_type_name(device.type) + ":" +
           std::to_string(device.index) + " (the device of q), got " + t.describe();
  });
  require(t.data != nullptr || t.numel() == 0, name, "data pointer is null");
  if (last_contiguous && !empty && t.ndim > 0 && t.shape[t.ndim - 1] > 1)
    require(t.stride[t.ndim - 1] == 1, name, [&] {
      return "last dimension must be contiguous (stride 1), got stride " +
             std::to_string(t.stride[t.ndim - 1]);
    });
}

void check_index_tensor(const TensorView& t, const char* name, std::initializer_list<int64_t> shape,
                        const Device& device) {
  check_tensor(t, name, shape, {DType::i32}, device);
  require(t.is_contiguous(), name, [&] { return "must be contiguous, got " + t.describe(); });
}

namespace {

/// Whether some k with |k_i| < count_i for i < n puts sum k_i * stride_i (bytes) within less than an
/// element of `delta`: the byte distance between the bases of two views of one layout, which then share a
/// byte. Strides ascend and each steps past everything the smaller ones reach, so for the largest only
/// the one or two multiples nearest `delta` can be part of a hit.
bool lattice_hits(int64_t delta, const int64_t* stride, const int64_t* count, int n, int64_t elem) {
  if (n == 0) return delta > -elem && delta < elem;
  int64_t reach = elem - 1;  // |sum over the smaller dimensions| + (elem - 1) at most
  for (int i = 0; i < n - 1; ++i) reach += (count[i] - 1) * stride[i];
  const int64_t s = stride[n - 1], top = count[n - 1] - 1;
  auto floor_div = [](int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); };
  const int64_t lo = std::max(-top, -floor_div(reach - delta, s)),
                hi = std::min(top, floor_div(delta + reach, s));
  for (int64_t k = lo; k <= hi; ++k)
    if (lattice_hits(delta - k * s, stride, count, n - 1, elem)) return true;
  return false;
}

/// Whether two views with the same shape, strides and dtype share a byte; views that interleave (the
/// q, k and v slices of one packed qkv tensor, or of its gradient) do not. Views that overlap themselves
/// count as overlapping.
bool same_layout_views_overlap(const TensorView& a, const TensorView& b) {
  const int64_t elem = dtype_size(a.dtype);
  int64_t stride[kMaxDims], count[kMaxDims];
  int n = 0;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] > 1) stride[n] = a.stride[d] * elem, count[n++] = a.shape[d];
  for (int i = 1; i < n; ++i)  // insertion sort by stride, count alongside
    for (int j = i; j > 0 && stride[j - 1] > stride[j]; --j)
      std::swap(stride[j - 1], stride[j]), std::swap(count[j - 1], count[j]);
  int64_t reach = elem - 1;
  for (int i = 0; i < n; ++i) {
    if (stride[i] <= reach) return true;
    reach += (count[i] - 1) * stride[i];
  }
  const auto base_a = reinterpret_cast<uintptr_t>(a.data), base_b = reinterpret_cast<uintptr_t>(b.data);
  return lattice_hits(static_cast<int64_t>(base_b - base_a), stride, count, n, elem);
}

}  // namespace

void check_no_overlap(const TensorView& out, const char* out_name, const TensorView& other,
                      const char* other_name, bool allow_same) {
  if (out.numel() == 0 || other.numel() == 0 || out.device != other.device) return;
  const bool same_layout = out.ndim == other.ndim && out.shape == other.shape && out.stride == other.stride &&
                           out.dtype == other.dtype;
  if (allow_same && same_layout && out.data == other.data) return;
  const auto a = out.byte_span(), b = other.byte_span();
  // byte_span is finite only where every extreme offset fits in int64, which lattice_hits relies on.
  const bool finite =
      a[1] != std::numeric_limits<uintptr_t>::max() && b[1] != std::numeric_limits<uintptr_t>::max();
  require(a[1] <= b[0] || b[1] <= a[0] || (same_layout && finite && !same_layout_views_overlap(out, other)),
          out_name,
          [&] { return std::string("memory overlaps ") + other_name + " (outputs must not alias inputs)"; });
}

void check_no_self_overlap(const TensorView& t, const char* name, const char* why) {
  if (t.numel() == 0) return;
  // Dimensions by increasing stride: each stride must step past everything the smaller ones reach.
  int order[kMaxDims], n = 0;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) order[n++] = d;
  std::sort(order, order + n, [&](int a, int b) { return t.stride[a] < t.stride[b]; });
  int64_t reach = 0;  // largest element offset reachable through the dimensions seen so far
  for (int i = 0; i < n; ++i) {
    const int d = order[i];
    require(t.stride[d] > reach, name, [&] {
      return std::string("is written in place (") + why +
             "), so its elements must not share memory; got a broadcast or overlapping view, stride " +
             std::to_string(t.stride[d]) + " at dimension " + std::to_string(d) + " of " + t.describe();
    });
    reach += (t.shape[d] - 1) * t.stride[d];
  }
}

}  // namespace flashport::core
