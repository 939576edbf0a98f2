// The HIP backend's architecture table: supported CDNA parts map to the code objects the build makes,
// everything else gets a named reason.
#include <gtest/gtest.h>

#include "backends/hip/arch.hpp"

namespace flashport::amd {
namespace {

TEST(HipArch, CdnaPartsWithCodeObjects) {
  EXPECT_EQ(amd_arch_choice("gfx90a:sramecc+:xnack-").code_object, "gfx90a");
  EXPECT_EQ(amd_arch_choice("gfx942:sramecc+:xnack-").code_object, "gfx942");
  EXPECT_TRUE(amd_arch_choice("gfx942").reason.empty());
}

TEST(HipArch, OthersAreNamedNotSupported) {
  for (const char* arch : {"gfx940", "gfx941", "gfx950", "gfx908", "gfx1100", "gfx1030", "gfx906"}) {
    const ArchChoice c = amd_arch_choice(arch);
    EXPECT_TRUE(c.code_object.empty()) << arch;
    EXPECT_NE(c.reason.find(std::string("AMD ") + arch + " is not supported"), std::string::npos) << c.reason;
  }
}

}  // namespace
}  // namespace flashport::amd
