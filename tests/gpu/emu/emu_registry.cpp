// The emulator's kernel table (see emu_kernels.hpp).
#include <map>

#include "emu_kernels.hpp"

namespace flashport::emu {
namespace {
std::map<std::string, KernelFn>& table() {
  static std::map<std::string, KernelFn> t;
  return t;
}
}  // namespace

std::string kernel_name(const jit::KernelSpec& spec) {
  std::string s = spec.entry + "|";
  for (size_t i = 0; i < spec.defines.size(); ++i)
    s += (i ? "," : "") + spec.defines[i].first + "=" + spec.defines[i].second;
  return s;
}

KernelFn find_kernel(const jit::KernelSpec& spec) {
  const auto it = table().find(kernel_name(spec));
  return it == table().end() ? nullptr : it->second;
}

Registrar::Registrar(const char* name, KernelFn fn) {
  table()[name] = fn;
}

}  // namespace flashport::emu
