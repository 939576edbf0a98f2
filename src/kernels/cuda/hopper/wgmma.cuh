// wgmma.mma_async m64nNk16 with fp32 accumulators for the element type FP_DTYPE (bf16 / f16), N a
// multiple of 16 up to 256: A from shared memory (ss) or registers (rs), B from shared memory.
// The inline-asm operand lists are spelled out by the macros below (operand numbers must be literal).
//
// Accumulator layout (PTX ISA "wgmma .m64nNk16 register fragment layout for D"): warp w of the
// warpgroup owns rows 16w..16w+15; with g = lane / 4 and t = lane % 4, d[4j + 2h + e] holds
// (row 16w + g + 8h, column 8j + 2t + e), j < N/8, h, e in {0, 1}.
// Register A (rs): four registers of two elements, low half first: a0 = (g, 2t..2t+1),
// a1 = (g + 8, 2t..), a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..) of the warp's 16 x 16 slice, so the
// accumulator pairs d[8k + 2q], d[8k + 2q + 1] of a 64 x 16 column block k become register q of A.
#pragma once

#include "cuda/common/types.cuh"

#ifndef FP_DTYPE
#error "wgmma.cuh needs -D FP_DTYPE=bf16|f16"
#endif

#define FPW_STR2(x) #x
#define FPW_STR(x) FPW_STR2(x)
#define FPW_TYPE FPW_STR(FP_DTYPE)

// "%0, ..., %(8k-1)": the accumulator operand names of the first 8k accumulators.
#define FPW_S1 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FPW_S2 FPW_S1 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define FPW_S3 FPW_S2 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define FPW_S4 FPW_S3 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define FPW_S5 FPW_S4 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FPW_S6 FPW_S5 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FPW_S7 FPW_S6 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define FPW_S8 FPW_S7 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define FPW_S9 FPW_S8 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define FPW_S10 FPW_S9 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define FPW_S11 FPW_S10 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define FPW_S12 FPW_S11 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define FPW_S13 FPW_S12 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define FPW_S14 FPW_S13 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define FPW_S15 FPW_S14 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define FPW_S16 FPW_S15 ", %120, %121, %122, %123, %124, %125, %126, %127"
// The matching "+f" operand list over the array d.
#define FPW_OCHUNK(i)                                                                             \
  "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define FPW_O1 FPW_OCHUNK(0)
#define FPW_O2 FPW_O1, FPW_OCHUNK(8)
#define FPW_O3 FPW_O2, FPW_OCHUNK(16)
#define FPW_O4 FPW_O3, FPW_OCHUNK(24)
#define FPW_O5 FPW_O4, FPW_OCHUNK(32)
#define FPW_O6 FPW_O5, FPW_OCHUNK(40)
#define FPW_O7 FPW_O6, FPW_OCHUNK(48)
#define FPW_O8 FPW_O7, FPW_OCHUNK(56)
#define FPW_O9 FPW_O8, FPW_OCHUNK(64)
#define FPW_O10 FPW_O9, FPW_OCHUNK(72)
#define FPW_O11 FPW_O10, FPW_OCHUNK(80)
#define FPW_O12 FPW_O11, FPW_OCHUNK(88)
#define FPW_O13 FPW_O12, FPW_OCHUNK(96)
#define FPW_O14 FPW_O13, FPW_OCHUNK(104)
#define FPW_O15 FPW_O14, FPW_OCHUNK(112)
#define FPW_O16 FPW_O15, FPW_OCHUNK(120)

namespace flashport::cuda::sm90 {

/// wgmma with N output columns; specialised below for every N in 16, 32, ..., 256.
template <int N>
struct Wgmma;
/// The same with e4m3 operands (k32: one k step is 32 one-byte elements, the 32 bytes of a 16-bit step).
template <int N>
struct WgmmaFp8;

}  // namespace flashport::cuda::sm90

// K = N / 16 groups of 8 accumulators; A0.. are the operand numbers after the accumulators. SHAPE is
// "k16.f32.<type>.<type>" (bf16 / f16) or "k32.f32.e4m3.e4m3"; IMM the operands after the scales:
// the transposes of A and B as literal immediates (16-bit types), none for fp8 (K-major only).
// ss: D (+)= A(desc) * B(desc), K-major A and B (imm-trans 0, 0); scale_d = 0 overwrites D.
// ss_mn: the same with MN-major A and B (imm-trans 1, 1: both stored with M / N contiguous).
// ss_kmn: K-major A, MN-major B (imm-trans 0, 1).
// rs: D (+)= A(regs) * B(desc) with B MN-major (imm-trans-b 1); fp8: B K-major.
#define FPW_SS_METHOD(NAME, N, K, A0, A1, A2, SHAPE, IMM)                                            \
  static FP_DEV void NAME(float(&d)[N / 2], u64 desc_a, u64 desc_b, u32 scale_d) {                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A2                                            \
                 ", 0;\n"                                                                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N SHAPE " {" FPW_S##K "}, %" #A0 ", %" #A1     \
                                                                            ", p, 1, 1" IMM ";\n}\n" \
                 : FPW_O##K                                                                          \
                 : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                          \
  }
#define FPW_RS_METHOD(N, K, A0, A1, A2, A3, A4, A5, SHAPE, IMM)                                      \
  static FP_DEV void rs(float(&d)[N / 2], u32 a0, u32 a1, u32 a2, u32 a3, u64 desc_b, u32 scale_d) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #A5                                            \
                 ", 0;\n"                                                                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N SHAPE " {" FPW_S##K                          \
                 "}, {%" #A0 ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #A4 ", p, 1, 1" IMM ";\n}\n"       \
                 : FPW_O##K                                                                          \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d));                   \
  }
#define FPW_SHAPE16 "k16.f32." FPW_TYPE "." FPW_TYPE
#define FPW_SHAPE8 "k32.f32.e4m3.e4m3"
#define FPW_DEFINE(N, K, A0, A1, A2, A3, A4, A5)                    \
  namespace flashport::cuda::sm90 {                                 \
  template <>                                                       \
  struct Wgmma<N> {                                                 \
    FPW_SS_METHOD(ss, N, K, A0, A1, A2, FPW_SHAPE16, ", 0, 0")      \
    FPW_SS_METHOD(ss_mn, N, K, A0, A1, A2, FPW_SHAPE16, ", 1, 1")   \
    FPW_SS_METHOD(ss_kmn, N, K, A0, A1, A2, FPW_SHAPE16, ", 0, 1")  \
    FPW_RS_METHOD(N, K, A0, A1, A2, A3, A4, A5, FPW_SHAPE16, ", 1") \
  };                                                                \
  template <>                                                       \
  struct WgmmaFp8<N> {                                              \
    FPW_SS_METHOD(ss, N, K, A0, A1, A2, FPW_SHAPE8, "")             \
    FPW_RS_METHOD(N, K, A0, A1, A2, A3, A4, A5, FPW_SHAPE8, "")     \
  };                                                                \
  }

FPW_DEFINE(16, 1, 8, 9, 10, 11, 12, 13)
FPW_DEFINE(32, 2, 16, 17, 18, 19, 20, 21)
FPW_DEFINE(48, 3, 24, 25, 26, 27, 28, 29)
FPW_DEFINE(64, 4, 32, 33, 34, 35, 36, 37)
FPW_DEFINE(80, 5, 40, 41, 42, 43, 44, 45)
FPW_DEFINE(96, 6, 48, 49, 50, 51, 52, 53)
FPW_DEFINE(112, 7, 56, 57, 58, 59, 60, 61)
FPW_DEFINE(128, 8, 64, 65, 66, 67, 68, 69)
FPW_DEFINE(144, 9, 72, 73, 74, 75, 76, 77)
FPW_DEFINE(160, 10, 80, 81, 82, 83, 84, 85)
FPW_DEFINE(176, 11, 88, 89, 90, 91, 92, 93)
FPW_DEFINE(192, 12, 96, 97, 98, 99, 100, 101)
FPW_DEFINE(208, 13, 104, 105, 106, 107, 108, 109)
FPW_DEFINE(224, 14, 112, 113, 114, 115, 116, 117)
FPW_DEFINE(240, 15, 120, 121, 122, 123, 124, 125)
FPW_DEFINE(256, 16, 128, 129, 130, 131, 132, 133)

#undef FPW_DEFINE
#undef FPW_SS_METHOD
#undef FPW_RS_METHOD

#include "cuda/hopper/wgmma_gemm.cuh"
