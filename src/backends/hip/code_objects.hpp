// The HIP code objects of this build (cmake/hip_kernels.cmake compiles them, cmake/hip_backend.cmake
// embeds them into the library), named "<arch>/<file>.co" as under build/hip/.
#pragma once

#include <cstddef>

namespace flashport::amd {

struct CodeObject {
  const char* name;
  const unsigned char* data;
  size_t size;
};

/// The embedded code objects (generated: hip_code_objects.cpp in the build tree).
extern const CodeObject kCodeObjects[];
extern const int kCodeObjectCount;

}  // namespace flashport::amd
