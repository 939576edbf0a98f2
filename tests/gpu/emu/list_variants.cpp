// Prints the portable forward variants of the dispatcher (forward_variants: the 2-byte ones and the
// fp8 ones) of one entry point for one arch as compiler flags, one line each (build.sh compiles an
// emulated kernel per line): `list_variants ARCH [ENTRY]`, ENTRY attn_fwd (default) or attn_fwd_f32.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/sm80/forward.hpp"

int main(int argc, char** argv) {
  const int arch = argc > 1 ? std::atoi(argv[1]) : 90;
  const std::string entry = argc > 2 ? argv[2] : "attn_fwd";
  for (const auto& spec : flashport::cuda::forward_variants(arch)) {
    if (spec.entry != entry) continue;
    std::string tag, flags;
    for (const auto& [k, v] : spec.defines) {
      flags += " -D" + k + "=" + v;
      tag += "_" + v;
    }
    std::printf("%s -Dfwd=fwd%s -Dfwd32=fwd32%s -D%s=%s%s\n", flags.c_str(), tag.c_str(), tag.c_str(),
                entry.c_str(), entry.c_str(), tag.c_str());
  }
}
