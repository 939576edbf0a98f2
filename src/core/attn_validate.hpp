// Validation of attention arguments and their translation into AttnProblem (shared by every entry point).
#pragma once

#include "flashport/attention.hpp"
#include "problem.h"

namespace flashport::core {

/// Checks q, k, v, out, the options and the sequence layout (dense, varlen, paged), and returns the
/// problem block with every pointer, stride and size filled in. Throws Error naming the argument.
AttnProblem build_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& opts, const SequenceLayout& lay,
                            void* stream);

/// Checks an LSE buffer's shape for `p` ((b, hq, sq) dense, (hq, total_q) varlen) and attaches it.
void attach_lse(AttnProblem& p, const TensorView& lse, const Device& dev);

}  // namespace flashport::core
