// Scalar and short-vector types shared by every target of the wave layer. The vectors are GCC/clang
// `vector_size` types: g++ (the CPU model) and clang (HIP) both index and copy them, and on AMD they are
// the register tuples the MFMA builtins take (bit-cast in cdna.hpp).
#pragma once

namespace flashport::wave {

using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i64 = long long;

typedef unsigned short u16x4 __attribute__((vector_size(8)));   // an MFMA A/B operand: 4 x 16-bit
typedef unsigned short u16x8 __attribute__((vector_size(16)));  // one 16-byte global load
typedef float f32x4 __attribute__((vector_size(16)));           // an MFMA 16x16 C/D operand

}  // namespace flashport::wave
