// The forward model tests' harness: a Case (common/cases.hpp) run through the CDNA forward on the CPU
// wave64 model with the inputs and options the CPU fast-path tests use (fastcheck), so the CPU backend's
// reference and baseline of the same call are the oracle.
#pragma once

#include "core/attn_validate.hpp"
#include "cpu/test_fast_util.hpp"
#include "hip_model_forward.hpp"

namespace flashport::test::hipmodel {

/// Out and LSE of `c` on inputs `in` from the model kernel (both poisoned with NaN first).
/// `pack_gqa`, `num_splits`: as hipmodel::forward (0: the backend's packing rule; 1: no split-KV).
inline fastcheck::Forward run_model(const Case& c, const fastcheck::Inputs& in, bool vec = true,
                                    int pack_gqa = 0, int num_splits = 1) {
  fastcheck::Forward got{HostTensor(c.dtype, out_shape(c)), HostTensor(DType::f32, lse_shape(c))};
  poison(got.out);
  poison(got.lse);
  AttnProblem p = core::build_attention(in.q, in.k, in.v, got.out, fastcheck::options(c, in),
                                        fastcheck::layout(c, in), nullptr);
  core::attach_lse(p, got.lse, Device{});
  forward(p, vec, pack_gqa, num_splits);
  return got;
}

/// Runs `c` through the model kernel on fresh inputs and checks out and LSE against the reference by
/// the accuracy rule.
inline void check(const Case& c, bool vec = true, int pack_gqa = 0, int num_splits = 1) {
  SCOPED_TRACE(c.describe() + (vec ? "" : " (2-byte loads)") +
               (pack_gqa ? " pack_gqa " + std::to_string(pack_gqa) : "") +
               (num_splits > 1 ? " splits " + std::to_string(num_splits) : ""));
  const fastcheck::Inputs in = fastcheck::make_inputs(c);
  const fastcheck::Forward got = run_model(c, in, vec, pack_gqa, num_splits);
  const fastcheck::Forward ref = fastcheck::run_forward(c, in, Impl::reference);
  const fastcheck::Forward base = fastcheck::run_forward(c, in, Impl::baseline);
  EXPECT_TRUE(accuracy_rule(got.out, base.out, ref.out)) << "out";
  EXPECT_TRUE(accuracy_rule(got.lse, base.lse, ref.lse)) << "lse";
}

}  // namespace flashport::test::hipmodel
