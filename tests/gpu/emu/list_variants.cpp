// Prints the portable forward variants of the dispatcher (forward_variants: the 2-byte ones and the
// fp8 ones) for one arch as compiler flags, one line each (build.sh compiles an emulated kernel per line).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/sm80/forward.hpp"

int main(int argc, char** argv) {
  const int arch = argc > 1 ? std::atoi(argv[1]) : 90;
  for (const auto& spec : flashport::cuda::forward_variants(arch)) {
    std::string tag, flags;
    for (const auto& [k, v] : spec.defines) {
      flags += " -D" + k + "=" + v;
      tag += "_" + v;
    }
    std::printf("%s -Dfwd=fwd%s -Dattn_fwd=attn_fwd%s\n", flags.c_str(), tag.c_str(), tag.c_str());
  }
}
