// Validation of attention arguments and their translation into AttnProblem (shared by every entry point).
#pragma once

#include <optional>

#include "backend.hpp"
#include "flashport/attention.hpp"
#include "problem.h"

namespace flashport::core {

/// Checks q, k, v, out, the options and the sequence layout (dense, varlen, paged), and returns the
/// problem block with every pointer, stride and size filled in. Throws Error naming the argument.
/// `table_lengths_later`: a paged call whose lengths come after (the kv cache's cache_seqlens) leaves the
/// block-table values to check_block_table_values, which the caller runs once it knows them.
AttnProblem build_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& opts, const SequenceLayout& lay,
                            void* stream, bool table_lengths_later = false);

/// The block-table entries `p`'s sequences use (those the kernels read: index_rules.h's
/// block_table_columns) lie in [0, num_blocks) (host-readable tables only).
void check_block_table_values(const TensorView& block_table, AttnProblem p,
                              const std::optional<TensorView>& cu_seqlens_k,
                              const std::optional<TensorView>& seqused_k);

/// forward_kvcache's validation and problem block (the entry point is begin_call, this, then the
/// backend's forward_kvcache); tests call it to run a kernel on exactly what a backend would receive.
KvCacheProblem build_kvcache(const KvCacheArgs& a);

/// Checks an LSE buffer's shape for `p` ((b, hq, sq) dense, (hq, total_q) varlen) and attaches it.
void attach_lse(AttnProblem& p, const TensorView& lse, const Device& dev);

}  // namespace flashport::core
