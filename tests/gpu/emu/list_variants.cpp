// Prints the forward variants of the dispatcher for one arch as compiler flags, one line each
// (build.sh compiles an emulated kernel per line).
#include <cstdio>
#include <cstdlib>

#include "backends/cuda/variants.hpp"
#include "core/problem.h"

int main(int argc, char** argv) {
  const int arch = argc > 1 ? std::atoi(argv[1]) : 90;
  for (int type : {flashport::kF16, flashport::kBF16})
    for (int bucket : flashport::cuda::kHeadDimBuckets) {
      const auto spec = flashport::cuda::forward_spec(arch, type, bucket);
      std::string tag, flags;
      for (const auto& [k, v] : spec.defines) {
        flags += " -D" + k + "=" + v;
        tag += "_" + v;
      }
      std::printf("%s -Dfwd=fwd%s -Dattn_fwd=attn_fwd%s\n", flags.c_str(), tag.c_str(), tag.c_str());
    }
}
