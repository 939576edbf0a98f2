// Prints the portable variants of the dispatcher of one entry point for one arch as compiler flags, one
// line each (build.sh compiles an emulated kernel per line): `list_variants ARCH [ENTRY]`, ENTRY attn_fwd
// (default: the 2-byte and fp8 forwards), attn_fwd_f32 or attn_bwd_f32.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/sm80/backward.hpp"
#include "backends/cuda/sm80/forward.hpp"

int main(int argc, char** argv) {
  const int arch = argc > 1 ? std::atoi(argv[1]) : 90;
  const std::string entry = argc > 2 ? argv[2] : "attn_fwd";
  const bool bwd = entry.rfind("attn_bwd", 0) == 0;
  for (const auto& spec :
       bwd ? flashport::cuda::backward_main_variants(arch) : flashport::cuda::forward_variants(arch)) {
    if (spec.entry != entry) continue;
    // The decode variant's bulk row copies (FP_BULK, FLASHPORT_DECODE 8 and 9: cp.async.bulk onto
    // mbarriers, inline sm_90 PTX) have no emulation; the defaults never take them. Its cluster merge
    // (FP_CLUSTER) has: emu/cuda/hopper/sm90.cuh.
    bool bulk = false;
    for (const auto& [k, v] : spec.defines) bulk = bulk || (k == "FP_BULK" && v != "0");
    if (bulk) continue;
    std::string tag, flags;
    for (const auto& [k, v] : spec.defines) {
      flags += " -D" + k + "=" + v;
      tag += "_" + k.substr(3) + v;  // the name too: values alone collide (FP_FP8=1 / FP_CLUSTER=1)
    }
    std::printf("%s -Dfwd=fwd%s -Dfwd32=fwd32%s -Dbwd32=bwd32%s -D%s=%s%s\n", flags.c_str(), tag.c_str(),
                tag.c_str(), tag.c_str(), entry.c_str(), entry.c_str(), tag.c_str());
  }
}
