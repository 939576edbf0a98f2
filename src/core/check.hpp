// Argument checks that raise flashport::Error naming the argument, with expected vs actual.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>

#include "flashport/error.hpp"
#include "flashport/tensor.hpp"

namespace flashport::core {

/// Throws Error(arg, message) unless `ok`. `message` may be a callable returning the text, so the
/// string is only built on failure (validation runs on every call, decode calls included).
template <class Message>
inline void require(bool ok, const char* arg, Message&& message) {
  if (ok) return;
  if constexpr (std::is_invocable_v<Message>)
    throw Error(arg, std::string(message()));
  else
    throw Error(arg, std::string(message));
}

/// Shape pattern: -1 matches any extent.
std::string shape_text(std::initializer_list<int64_t> dims);

/// A present tensor: non-null data (unless empty), the given shape, one of `dtypes`, channel stride 1
/// (when `last_contiguous`), non-negative strides, and on `device`.
void check_tensor(const TensorView& t, const char* name, std::initializer_list<int64_t> shape,
                  std::initializer_list<DType> dtypes, const Device& device, bool last_contiguous = true);

/// Contiguous int32 index tensor of the given shape on `device`.
void check_index_tensor(const TensorView& t, const char* name, std::initializer_list<int64_t> shape,
                        const Device& device);

/// Outputs must not share memory with `other` unless they are the very same view (`allow_same`).
void check_no_overlap(const TensorView& out, const char* out_name, const TensorView& other,
                      const char* other_name, bool allow_same = false);
inline void check_no_overlap(const TensorView& out, const char* out_name,
                             const std::optional<TensorView>& other, const char* other_name) {
  if (other) check_no_overlap(out, out_name, *other, other_name);
}

/// A tensor written in place must give every element its own memory (no broadcast, stride-0 view).
void check_no_self_overlap(const TensorView& t, const char* name, const char* why);

/// The int32 values of a (checked, contiguous) index tensor on the host: host tensors in place; GPU
/// tensors only in checked mode, through one synchronising copy per tensor and call (kept until the
/// next begin_call on this thread); otherwise null: library calls never synchronise, and the kernels
/// guard device-resident indices instead.
const int32_t* host_ints(const TensorView& t);

/// Starts a public entry point's validation on this thread: drops the previous call's host copies and
/// records the stream that checked-mode copies are ordered on.
void begin_call(void* stream);

}  // namespace flashport::core
