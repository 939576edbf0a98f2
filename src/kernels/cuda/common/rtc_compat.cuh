// Include first in every kernel source, before core/*.h: fills gaps of the NVRTC front end.
#pragma once

// NVRTC's front end lacks __builtin_huge_valf (core/semantics.h uses it for kNegInf); bit_cast is a
// constant expression there. Harmless once semantics.h stops using the builtin.
#if defined(__CUDACC_RTC__) && !defined(__builtin_huge_valf)
#define __builtin_huge_valf() __builtin_bit_cast(float, 0x7f800000u)
#endif
