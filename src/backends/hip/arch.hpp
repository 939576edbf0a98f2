// Which AMD GPUs the HIP kernels serve, decided from a device's architecture name as the HIP runtime
// reports it (hipDeviceProp_t::gcnArchName, e.g. "gfx90a:sramecc+:xnack-"). The first piece of the HIP
// runtime backend (issue #17); the rest (hipModule loading, streams, launch) is a later slice.
#pragma once

#include <string>
#include <string_view>

namespace flashport::amd {

/// The code-object architecture to load for a device, or the reason it is not supported.
struct ArchChoice {
  std::string code_object;  // "gfx90a", "gfx942"; empty when unsupported
  std::string reason;       // empty when supported
};

/// gfx90a (CDNA2: MI210, MI250, MI250X) and gfx942 (CDNA3: MI300X, MI300A, MI325X) have code objects
/// (cmake/hip_kernels.cmake builds exactly these). Everything else gets a reason naming the device.
inline ArchChoice amd_arch_choice(std::string_view gcn_arch_name) {
  const std::string_view arch = gcn_arch_name.substr(0, gcn_arch_name.find(':'));  // drop feature flags
  const std::string name(arch);
  auto unsupported = [&](const char* why) {
    return ArchChoice{"", "AMD " + name + " is not supported by the HIP backend: " + why};
  };
  if (arch == "gfx90a" || arch == "gfx942") return {name, ""};
  if (arch == "gfx940" || arch == "gfx941")
    return unsupported(
        "a CDNA3 variant with its own ISA version; no code object is built for it (gfx942 only)");
  if (arch == "gfx950") return unsupported("CDNA4 needs a newer compiler than the clang-19 the build uses");
  if (arch == "gfx908") return unsupported("CDNA1 (MI100) lacks the bf16 MFMA forms the kernels use");
  if (arch.substr(0, 4) == "gfx1") return unsupported("RDNA GPUs (wave32, WMMA) are not targeted; CDNA only");
  return unsupported("only CDNA2 (gfx90a) and CDNA3 (gfx942) are targeted");
}

}  // namespace flashport::amd
