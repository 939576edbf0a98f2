// Prints the variants of the dispatcher of one entry point for one arch as compiler flags, one line each
// (build.sh compiles an emulated kernel per line): `list_variants ARCH [ENTRY]`, ENTRY attn_fwd (default: the
// 2-byte and fp8 forwards), attn_fwd_f32 or attn_bwd_f32. `list_variants ARCH headers DIR` writes one header
// per variant of the Hopper (sm_90a) kernels and of the portable 16-bit backward into DIR instead (its
// defines, the entry point and the flashport::cuda namespace renamed so the variants link together, the
// registry key and the kernel source: emu_variant.cpp) and prints their paths.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "backends/cuda/sm80/backward.hpp"
#include "backends/cuda/sm80/forward.hpp"
#include "backends/cuda/sm90/hopper_bwd.hpp"
#include "backends/cuda/sm90/hopper_fwd.hpp"

namespace {

int write_headers(int arch, const std::string& dir) {
  int n = 0;
  for (auto* variants : {&flashport::cuda::hopper::variants, &flashport::cuda::hopper_bwd::variants,
                         &flashport::cuda::backward_main_variants}) {
    for (const auto& spec : variants(arch)) {
      if (spec.entry == "attn_bwd_f32") continue;  // emu_attn_bwd_f32.cpp
      const int i = n++;
      const std::string path = dir + "/variant_" + std::to_string(i) + ".h";
      std::ofstream h(path);
      std::string key = spec.entry + "|";
      for (size_t i = 0; i < spec.defines.size(); ++i) {
        const auto& [k, v] = spec.defines[i];
        h << "#define " << k << " " << v << "\n";
        key += (i ? "," : "") + k + "=" + v;
      }
      h << "#define " << spec.entry << " " << spec.entry << "_" << i << "\n";
      // The kernel-side namespace too: its inline functions and types differ per variant (tile shapes,
      // dtype), and the linker would otherwise keep one definition of each for all variants.
      h << "#define cuda cuda_" << i << "\n";
      h << "#define FP_EMU_ENTRY " << spec.entry << "\n";
      h << "#define FP_EMU_KEY \"" << key << "\"\n";
      h << "#define FP_EMU_SOURCE \"" << spec.source << "\"\n";
      std::printf("%s\n", path.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int arch = argc > 1 ? std::atoi(argv[1]) : 90;
  const std::string entry = argc > 2 ? argv[2] : "attn_fwd";
  if (entry == "headers") return write_headers(arch, argc > 3 ? argv[3] : ".");
  const bool bwd = entry.rfind("attn_bwd", 0) == 0;
  for (const auto& spec :
       bwd ? flashport::cuda::backward_main_variants(arch) : flashport::cuda::forward_variants(arch)) {
    if (spec.entry != entry) continue;
    std::string tag, flags;
    for (const auto& [k, v] : spec.defines) {
      flags += " -D" + k + "=" + v;
      tag += "_" + k.substr(3) + v;  // the name too: values alone collide (FP_FP8=1 / FP_CLUSTER=1)
    }
    std::printf("%s -Dfwd=fwd%s -Dfwd32=fwd32%s -Dbwd32=bwd32%s -D%s=%s%s\n", flags.c_str(), tag.c_str(),
                tag.c_str(), tag.c_str(), entry.c_str(), entry.c_str(), tag.c_str());
  }
}
