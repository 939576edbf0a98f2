// The CPU fast path: tiled online-softmax forward and backward, multithreaded and vectorised.
#pragma once

#include <string>

#include "core/problem.h"

namespace flashport::cpu::fast {

/// Empty when the fast path covers `p`; otherwise why not (the CPU backend then runs the reference).
std::string unsupported(const AttnProblem& p, bool backward);
void forward(const AttnProblem& p);
void backward(const AttnProblem& p);

}  // namespace flashport::cpu::fast
