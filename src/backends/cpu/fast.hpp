// The CPU fast path: tiled online-softmax forward and backward, multithreaded and vectorised.
#pragma once

#include <string>

#include "core/problem.h"

namespace flashport::cpu::fast {

/// Empty when the fast path covers `p`; otherwise why not (the CPU backend then runs the reference).
std::string unsupported(const AttnProblem& p, bool backward);
void forward(const AttnProblem& p);
void backward(const AttnProblem& p);
/// The kernel copy the forward runs for inputs of `in_type` (an ElemType) under the current
/// FLASHPORT_CPU_ISA: "avx512-amx", "avx512", "avx2" or "base"; `decode` names the decode kernel's copy
/// (fast_decode.hpp). For benchmarks and tests.
const char* forward_isa(int in_type, bool decode);

}  // namespace flashport::cpu::fast
