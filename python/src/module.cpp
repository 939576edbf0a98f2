// flashport._C: the C++ entry points bound with nanobind; every tensor crosses as a zero-copy DLPack view.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashport/flashport.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using flashport::DType;
using flashport::TensorView;
using Code = nb::dlpack::dtype_code;

/// The Python exception type (subclass of ValueError) that flashport::Error becomes.
nb::object g_error_type;

/// Keeps every imported DLPack tensor alive until the C++ call returns. A deque never moves its
/// elements, and the views only hold raw pointers into them.
struct Holder {
  std::deque<nb::ndarray<nb::ro>> inputs;
  std::deque<nb::ndarray<>> outputs;
};

[[noreturn]] void fail(const std::string& argument, const std::string& message) {
  throw flashport::Error(argument, message);
}

std::optional<DType> dtype_from_name(const std::string& s) {
  if (s == "float64") return DType::f64;
  if (s == "float32") return DType::f32;
  if (s == "float16") return DType::f16;
  if (s == "bfloat16") return DType::bf16;
  if (s == "float8_e4m3fn" || s == "e4m3") return DType::e4m3;
  if (s == "float8_e4m3fnuz" || s == "e4m3fnuz") return DType::e4m3fnuz;
  if (s == "float8_e5m2" || s == "e5m2") return DType::e5m2;
  if (s == "int32") return DType::i32;
  if (s == "int64") return DType::i64;
  return std::nullopt;
}

std::string dlpack_dtype_text(nb::dlpack::dtype t) {
  return "DLPack dtype (code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) + ", lanes " +
         std::to_string(t.lanes) + ")";
}

std::optional<DType> dtype_from_dlpack(nb::dlpack::dtype t) {
  if (t.lanes != 1) return std::nullopt;
  switch ((Code)t.code) {
    case Code::Float:
      if (t.bits == 64) return DType::f64;
      if (t.bits == 32) return DType::f32;
      if (t.bits == 16) return DType::f16;
      return std::nullopt;
    case Code::Bfloat:
      return t.bits == 16 ? std::optional(DType::bf16) : std::nullopt;
    case Code::Float8_E4M3FN:
      return DType::e4m3;
    case Code::Float8_E4M3FNUZ:
      return DType::e4m3fnuz;
    case Code::Float8_E5M2:
      return DType::e5m2;
    case Code::Int:
      if (t.bits == 32) return DType::i32;
      if (t.bits == 64) return DType::i64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

flashport::Device device_from_dlpack(int32_t type, int32_t id, const char* name) {
  using flashport::DeviceType;
  namespace dev = nb::device;
  if (type == dev::cpu::value || type == dev::cuda_host::value || type == dev::rocm_host::value)
    return {DeviceType::cpu, 0};  // pinned host memory is ordinary host memory to the CPU backend
  if (type == dev::cuda::value || type == dev::cuda_managed::value) return {DeviceType::cuda, id};
  if (type == dev::rocm::value) return {DeviceType::hip, id};
  fail(name, "tensor is on DLPack device type " + std::to_string(type) +
                 ", which flashport does not support (cpu, cuda and rocm are)");
}

/// Fills `view` from an imported DLPack tensor; `forced` overrides the dtype of 1-byte storage
/// (fp8 data handed over as uint8, e.g. from numpy, which has no fp8 types).
template <class Array>
TensorView view_from(const Array& a, const char* name, std::optional<DType> forced) {
  TensorView view;
  const nb::dlpack::dtype dt = a.dtype();
  if (forced) {
    if (dt.lanes != 1 || dt.bits != 8 * flashport::dtype_size(*forced))
      fail(name, std::string("cannot reinterpret ") + dlpack_dtype_text(dt) + " as " +
                     flashport::dtype_name(*forced) + " (element sizes differ)");
    view.dtype = *forced;
  } else {
    std::optional<DType> mapped = dtype_from_dlpack(dt);
    if (!mapped) fail(name, "unsupported " + dlpack_dtype_text(dt));
    view.dtype = *mapped;
  }
  if (a.ndim() > (size_t)flashport::kMaxDims)
    fail(name, "has " + std::to_string(a.ndim()) + " dimensions; at most " +
                   std::to_string(flashport::kMaxDims) + " are supported");
  view.ndim = (int)a.ndim();
  for (int i = 0; i < view.ndim; ++i) {
    view.shape[i] = a.shape(i);
    view.stride[i] = a.stride(i);
  }
  view.data = const_cast<void*>(static_cast<const void*>(a.data()));
  view.device = device_from_dlpack(a.device_type(), a.device_id(), name);
  return view;
}

/// torch tensors read straight from their attributes instead of a DLPack capsule: torch's
/// `__dlpack__` costs about 12 us a tensor (Python code, plus a `detach()` for tensors that require
/// grad), these reads about 1 us. The torch path registers torch's types at import; everything
/// else (numpy, cupy, jax, tensor subclasses, torch tensors on other devices) goes through DLPack.
struct TorchTypes {
  nb::object tensor, parameter;                      // torch.Tensor, torch.nn.Parameter (exact types)
  std::vector<std::pair<nb::object, DType>> dtypes;  // torch.float16 -> f16, ...
  nb::object data_ptr, shape, stride, dtype, is_cuda, is_cpu, get_device;  // interned names
  bool rocm = false;  // a ROCm build of torch: its "cuda" tensors live on AMD GPUs (the HIP backend)
};
TorchTypes* g_torch = nullptr;  // leaked on purpose: never released after the interpreter is gone

void register_torch(nb::handle tensor, nb::handle parameter, nb::dict dtypes, bool rocm) {
  TorchTypes t;
  t.rocm = rocm;
  t.tensor = nb::borrow(tensor);
  t.parameter = nb::borrow(parameter);
  for (auto [key, value] : dtypes) {
    const std::optional<DType> code = dtype_from_name(nb::cast<std::string>(value));
    if (!code) fail("dtypes", "unknown dtype name '" + nb::cast<std::string>(value) + "'");
    t.dtypes.emplace_back(nb::borrow(key), *code);
  }
  for (auto [slot, name] : {std::pair{&t.data_ptr, "data_ptr"},
                            {&t.shape, "shape"},
                            {&t.stride, "stride"},
                            {&t.dtype, "dtype"},
                            {&t.is_cuda, "is_cuda"},
                            {&t.is_cpu, "is_cpu"},
                            {&t.get_device, "get_device"}})
    *slot = nb::steal(PyUnicode_InternFromString(name));
  delete g_torch;
  g_torch = new TorchTypes(std::move(t));
}

/// The view of a plain torch tensor on the CPU or a CUDA device; nullopt for anything else (the
/// caller then imports it through DLPack, which also produces the errors for unsupported objects).
std::optional<TensorView> torch_view(nb::handle obj, const char* name) {
  if (!g_torch) return std::nullopt;
  const nb::handle type = obj.type();
  if (!type.is(g_torch->tensor) && !type.is(g_torch->parameter)) return std::nullopt;
  const bool cuda = nb::cast<bool>(obj.attr(g_torch->is_cuda));
  if (!cuda && !nb::cast<bool>(obj.attr(g_torch->is_cpu))) return std::nullopt;
  const nb::handle dtype = obj.attr(g_torch->dtype);
  TensorView view;
  bool known = false;
  for (const auto& [object, code] : g_torch->dtypes)
    if (dtype.is(object)) view.dtype = code, known = true;
  if (!known) fail(name, "unsupported torch dtype " + nb::cast<std::string>(nb::str(dtype)));
  const nb::object shape_obj = obj.attr(g_torch->shape), stride_obj = obj.attr(g_torch->stride)();
  const nb::tuple shape = nb::borrow<nb::tuple>(shape_obj), stride = nb::borrow<nb::tuple>(stride_obj);
  if (shape.size() > (size_t)flashport::kMaxDims)
    fail(name, "has " + std::to_string(shape.size()) + " dimensions; at most " +
                   std::to_string(flashport::kMaxDims) + " are supported");
  view.ndim = (int)shape.size();
  for (int i = 0; i < view.ndim; ++i) {
    view.shape[i] = nb::cast<int64_t>(shape[i]);
    view.stride[i] = nb::cast<int64_t>(stride[i]);
  }
  view.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(obj.attr(g_torch->data_ptr)()));
  const flashport::DeviceType gpu = g_torch->rocm ? flashport::DeviceType::hip : flashport::DeviceType::cuda;
  view.device = cuda ? flashport::Device{gpu, nb::cast<int>(obj.attr(g_torch->get_device)())}
                     : flashport::Device{flashport::DeviceType::cpu, 0};
  return view;
}

/// Splits an argument into (array object, dtype override): a tensor, or a tuple (tensor, "float8_e4m3fn").
std::pair<nb::handle, std::optional<DType>> unpack(nb::handle obj, const char* name) {
  if (!nb::isinstance<nb::tuple>(obj)) return {obj, std::nullopt};
  nb::tuple t = nb::borrow<nb::tuple>(obj);
  if (t.size() != 2 || !nb::isinstance<nb::str>(t[1]))
    fail(name, "expected a DLPack tensor or a (tensor, dtype name) pair");
  const std::string dtype_name = nb::cast<std::string>(t[1]);
  std::optional<DType> forced = dtype_from_name(dtype_name);
  if (!forced) fail(name, "unknown dtype name '" + dtype_name + "'");
  return {t[0], forced};
}

std::string py_type_name(nb::handle obj) {
  return nb::cast<std::string>(nb::type_name(obj.type()));
}

/// A read-only input. Never copies: anything that is not a DLPack/buffer-protocol tensor is rejected.
TensorView input(nb::handle obj, const char* name, Holder& hold) {
  if (std::optional<TensorView> view = torch_view(obj, name)) return *view;
  auto [arr_obj, forced] = unpack(obj, name);
  nb::ndarray<nb::ro> arr;
  if (!nb::try_cast(arr_obj, arr, /*convert=*/false))
    fail(name, "expected a DLPack tensor (torch, numpy, cupy, jax, ...), got " + py_type_name(arr_obj) +
                   " (tensors that require grad must be detached first)");
  hold.inputs.push_back(arr);
  return view_from(hold.inputs.back(), name, forced);
}

std::optional<TensorView> opt_input(nb::handle obj, const char* name, Holder& hold) {
  if (obj.is_none()) return std::nullopt;
  return input(obj, name, hold);
}

/// A tensor flashport writes into: must be writable (read-only numpy arrays are refused).
TensorView output(nb::handle obj, const char* name, Holder& hold) {
  if (std::optional<TensorView> view = torch_view(obj, name)) return *view;
  auto [arr_obj, forced] = unpack(obj, name);
  nb::ndarray<> arr;
  if (!nb::try_cast(arr_obj, arr, /*convert=*/false))
    fail(name, "expected a writable DLPack tensor, got " + py_type_name(arr_obj));
  hold.outputs.push_back(arr);
  return view_from(hold.outputs.back(), name, forced);
}

std::optional<TensorView> opt_output(nb::handle obj, const char* name, Holder& hold) {
  if (obj.is_none()) return std::nullopt;
  return output(obj, name, hold);
}

flashport::Impl impl_from(const std::string& s) {
  if (s == "automatic") return flashport::Impl::automatic;
  if (s == "reference") return flashport::Impl::reference;
  if (s == "baseline") return flashport::Impl::baseline;
  if (s == "fast") return flashport::Impl::fast;
  fail("impl", "must be automatic, reference, baseline or fast, got '" + s + "'");
}

/// The raw cudaStream_t/hipStream_t handle; 0 is the legacy default stream.
void* stream_from(uintptr_t handle) {
  return reinterpret_cast<void*>(handle);
}

struct Options {
  std::optional<double> softmax_scale;
  bool causal;
  int64_t window_left, window_right;
  double softcap;
  nb::handle alibi_slopes;
  double dropout_p;
  uint64_t seed;
  uint32_t offset;
  bool deterministic;
  nb::handle q_descale, k_descale, v_descale;
};

flashport::AttentionOptions options_from(const Options& o, Holder& hold) {
  flashport::AttentionOptions opts;
  opts.softmax_scale = o.softmax_scale;
  opts.causal = o.causal;
  opts.window_left = o.window_left;
  opts.window_right = o.window_right;
  opts.softcap = o.softcap;
  opts.alibi_slopes = opt_input(o.alibi_slopes, "alibi_slopes", hold);
  opts.dropout_p = o.dropout_p;
  opts.dropout_seed = o.seed;
  opts.dropout_offset = o.offset;
  opts.deterministic = o.deterministic;
  opts.q_descale = opt_input(o.q_descale, "q_descale", hold);
  opts.k_descale = opt_input(o.k_descale, "k_descale", hold);
  opts.v_descale = opt_input(o.v_descale, "v_descale", hold);
  return opts;
}

flashport::SequenceLayout layout_from(nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, nb::handle seqused_k,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k, nb::handle block_table,
                                      Holder& hold) {
  flashport::SequenceLayout lay;
  lay.cu_seqlens_q = opt_input(cu_seqlens_q, "cu_seqlens_q", hold);
  lay.cu_seqlens_k = opt_input(cu_seqlens_k, "cu_seqlens_k", hold);
  lay.seqused_k = opt_input(seqused_k, "seqused_k", hold);
  lay.max_seqlen_q = max_seqlen_q;
  lay.max_seqlen_k = max_seqlen_k;
  lay.block_table = opt_input(block_table, "block_table", hold);
  return lay;
}

void forward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::handle s_dmask,
             nb::handle cu_seqlens_q, nb::handle cu_seqlens_k, nb::handle seqused_k, int64_t max_seqlen_q,
             int64_t max_seqlen_k, nb::handle block_table, std::optional<double> softmax_scale, bool causal,
             int64_t window_left, int64_t window_right, double softcap, nb::handle alibi_slopes,
             double dropout_p, uint64_t seed, uint32_t offset, nb::handle q_descale, nb::handle k_descale,
             nb::handle v_descale, uintptr_t stream, const std::string& impl) {
  Holder hold;
  flashport::ForwardArgs a;
  a.q = input(q, "q", hold);
  a.k = input(k, "k", hold);
  a.v = input(v, "v", hold);
  a.out = output(out, "out", hold);
  a.lse = opt_output(lse, "lse", hold);
  a.s_dmask = opt_output(s_dmask, "s_dmask", hold);
  a.layout =
      layout_from(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table, hold);
  a.options = options_from({softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                            dropout_p, seed, offset, false, q_descale, k_descale, v_descale},
                           hold);
  a.stream = stream_from(stream);
  a.impl = impl_from(impl);
  nb::gil_scoped_release unlocked;
  flashport::forward(a);
}

void backward(nb::handle dout, nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse,
              nb::handle dq, nb::handle dk, nb::handle dv, nb::handle cu_seqlens_q, nb::handle cu_seqlens_k,
              nb::handle seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k, nb::handle block_table,
              std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right,
              double softcap, nb::handle alibi_slopes, double dropout_p, uint64_t seed, uint32_t offset,
              bool deterministic, uintptr_t stream, const std::string& impl) {
  Holder hold;
  flashport::BackwardArgs a;
  a.dout = input(dout, "dout", hold);
  a.q = input(q, "q", hold);
  a.k = input(k, "k", hold);
  a.v = input(v, "v", hold);
  a.out = input(out, "out", hold);
  a.lse = input(lse, "lse", hold);
  a.dq = output(dq, "dq", hold);
  a.dk = output(dk, "dk", hold);
  a.dv = output(dv, "dv", hold);
  a.layout =
      layout_from(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, block_table, hold);
  a.options = options_from({softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                            dropout_p, seed, offset, deterministic, nb::none(), nb::none(), nb::none()},
                           hold);
  a.stream = stream_from(stream);
  a.impl = impl_from(impl);
  nb::gil_scoped_release unlocked;
  flashport::backward(a);
}

void forward_kvcache(nb::handle q, nb::handle k_cache, nb::handle v_cache, nb::handle out, nb::handle lse,
                     nb::handle k_new, nb::handle v_new, nb::handle cache_seqlens, nb::handle cache_batch_idx,
                     nb::handle cache_leftpad, nb::handle block_table, nb::handle rotary_cos,
                     nb::handle rotary_sin, bool rotary_interleaved, int num_splits,
                     std::optional<double> softmax_scale, bool causal, int64_t window_left,
                     int64_t window_right, double softcap, nb::handle alibi_slopes, nb::handle q_descale,
                     nb::handle k_descale, nb::handle v_descale, uintptr_t stream, const std::string& impl) {
  Holder hold;
  flashport::KvCacheArgs a;
  a.q = input(q, "q", hold);
  // Appending writes into the caches; without k/v they are inputs and may be read-only (broadcast).
  const bool append = !k_new.is_none() || !v_new.is_none();
  a.k_cache = append ? output(k_cache, "k_cache", hold) : input(k_cache, "k_cache", hold);
  a.v_cache = append ? output(v_cache, "v_cache", hold) : input(v_cache, "v_cache", hold);
  a.out = output(out, "out", hold);
  a.lse = opt_output(lse, "lse", hold);
  a.k_new = opt_input(k_new, "k", hold);
  a.v_new = opt_input(v_new, "v", hold);
  a.cache_seqlens = opt_input(cache_seqlens, "cache_seqlens", hold);
  a.cache_batch_idx = opt_input(cache_batch_idx, "cache_batch_idx", hold);
  a.cache_leftpad = opt_input(cache_leftpad, "cache_leftpad", hold);
  a.block_table = opt_input(block_table, "block_table", hold);
  a.rotary_cos = opt_input(rotary_cos, "rotary_cos", hold);
  a.rotary_sin = opt_input(rotary_sin, "rotary_sin", hold);
  a.rotary_interleaved = rotary_interleaved;
  a.num_splits = num_splits;
  a.options = options_from({softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, 0.0, 0,
                            0, false, q_descale, k_descale, v_descale},
                           hold);
  a.stream = stream_from(stream);
  a.impl = impl_from(impl);
  nb::gil_scoped_release unlocked;
  flashport::forward_kvcache(a);
}

void merge_states(nb::handle out_a, nb::handle lse_a, nb::handle out_b, nb::handle lse_b, nb::handle out,
                  nb::handle lse, uintptr_t stream) {
  Holder hold;
  flashport::MergeArgs a;
  a.out_a = input(out_a, "out_a", hold);
  a.lse_a = input(lse_a, "lse_a", hold);
  a.out_b = input(out_b, "out_b", hold);
  a.lse_b = input(lse_b, "lse_b", hold);
  a.out = output(out, "out", hold);
  a.lse = opt_output(lse, "lse", hold);
  a.stream = stream_from(stream);
  nb::gil_scoped_release unlocked;
  flashport::merge_states(a);
}

// ---------------------------------------------------------------------------------------------
// Host-side element conversion, so numpy callers (no bf16/fp8 types) can produce and read
// low-precision storage with the library's own bit-exact rounding.

/// dst = src converted elementwise, both contiguous host tensors of equal size.
void cast(nb::handle src, nb::handle dst) {
  Holder hold;
  const TensorView s = input(src, "src", hold);
  const TensorView d = output(dst, "dst", hold);
  for (const auto* t : {&s, &d}) {
    const char* name = t == &s ? "src" : "dst";
    if (t->device.type != flashport::DeviceType::cpu) fail(name, "cast() runs on host memory only");
    if (t->dtype == DType::i32 || t->dtype == DType::i64)
      fail(name, "cast() converts floating-point types only");
    if (!t->is_contiguous()) fail(name, "cast() needs a contiguous tensor");
  }
  if (s.numel() != d.numel())
    fail("dst", "has " + std::to_string(d.numel()) + " elements, src has " + std::to_string(s.numel()));
  // Flat views: equal sizes suffice here, shapes may differ.
  const TensorView flat_s = TensorView::contiguous(s.data, s.dtype, {s.numel()});
  const TensorView flat_d = TensorView::contiguous(d.data, d.dtype, {d.numel()});
  nb::gil_scoped_release unlocked;
  flashport::cast(flat_s, flat_d);
}

/// (dtype name, shape, strides, (device type, index), data pointer) of a tensor as flashport sees it.
nb::tuple inspect(nb::handle obj) {
  Holder hold;
  const TensorView t = input(obj, "tensor", hold);
  nb::list shape, stride;
  for (int i = 0; i < t.ndim; ++i) {
    shape.append(t.shape[i]);
    stride.append(t.stride[i]);
  }
  return nb::make_tuple(flashport::dtype_name(t.dtype), nb::tuple(shape), nb::tuple(stride),
                        nb::make_tuple(flashport::device_type_name(t.device.type), t.device.index),
                        reinterpret_cast<uintptr_t>(t.data));
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "flashport C++ entry points (low level: callers allocate every output; see flashport.ops)";

  g_error_type = nb::steal(PyErr_NewExceptionWithDoc(
      "flashport.FlashportError", "Invalid argument or backend failure; `argument` names the culprit.",
      PyExc_ValueError, nullptr));
  m.attr("FlashportError") = g_error_type;
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const flashport::Error& e) {
      nb::object exc = g_error_type(nb::str(e.what()));
      nb::setattr(exc, "argument", nb::str(e.argument().c_str()));
      PyErr_SetObject(g_error_type.ptr(), exc.ptr());
    }
  });

  const nb::none none;
  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a = none, "s_dmask"_a = none,
        "cu_seqlens_q"_a = none, "cu_seqlens_k"_a = none, "seqused_k"_a = none, "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0, "block_table"_a = none, "softmax_scale"_a = none, "causal"_a = false,
        "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.0, "alibi_slopes"_a = none,
        "dropout_p"_a = 0.0, "seed"_a = 0, "offset"_a = 0, "q_descale"_a = none, "k_descale"_a = none,
        "v_descale"_a = none, "stream"_a = 0, "impl"_a = "automatic",
        "Attention forward into caller-allocated `out` (and optional `lse`, `s_dmask`). `stream` is the raw "
        "cudaStream_t handle (0: legacy default stream).");
  m.def("backward", &backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a,
        "cu_seqlens_q"_a = none, "cu_seqlens_k"_a = none, "seqused_k"_a = none, "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0, "block_table"_a = none, "softmax_scale"_a = none, "causal"_a = false,
        "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.0, "alibi_slopes"_a = none,
        "dropout_p"_a = 0.0, "seed"_a = 0, "offset"_a = 0, "deterministic"_a = false, "stream"_a = 0,
        "impl"_a = "automatic", "Attention backward into caller-allocated dq, dk, dv.");
  m.def("forward_kvcache", &forward_kvcache, "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "lse"_a = none,
        "k"_a = none, "v"_a = none, "cache_seqlens"_a = none, "cache_batch_idx"_a = none,
        "cache_leftpad"_a = none, "block_table"_a = none, "rotary_cos"_a = none, "rotary_sin"_a = none,
        "rotary_interleaved"_a = true, "num_splits"_a = 0, "softmax_scale"_a = none, "causal"_a = false,
        "window_left"_a = -1, "window_right"_a = -1, "softcap"_a = 0.0, "alibi_slopes"_a = none,
        "q_descale"_a = none, "k_descale"_a = none, "v_descale"_a = none, "stream"_a = 0,
        "impl"_a = "automatic", "Append k/v into the cache in place (optional rotary), then attend over it.");
  m.def("merge_states", &merge_states, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a = none,
        "stream"_a = 0, "Merge two partial attentions by their log-sum-exp.");
  m.def("cast", &cast, "src"_a, "dst"_a, "Host-side elementwise dtype conversion (round to nearest even).");
  m.def("inspect", &inspect, "tensor"_a,
        "How flashport sees a DLPack tensor: (dtype, shape, strides, device, ptr).");
  m.def("register_torch", &register_torch, "tensor"_a, "parameter"_a, "dtypes"_a, "rocm"_a = false,
        "Read torch.Tensor / nn.Parameter arguments from their attributes (no DLPack capsule); "
        "`dtypes` maps torch dtypes to flashport dtype names; `rocm`: torch's GPU tensors are on AMD "
        "devices (torch.version.hip).");
  m.def("set_checked_mode", &flashport::set_checked_mode, "on"_a,
        "Validate GPU-resident index tensors on the host (synchronising copies); see flashport.set_checked.");
  m.def("checked_mode", &flashport::checked_mode);
  m.def(
      "check_cuda_device",
      [](int index) {
        nb::gil_scoped_release release;  // it waits for the GPU
        flashport::check_device({flashport::DeviceType::cuda, index});
      },
      "index"_a, "Wait for GPU `index` and raise an index fault its kernels recorded; see flashport.check.");
  m.def("version", &flashport::version);
  m.def("available_backends", &flashport::available_backends);
}
