// Runs the CDNA backward kernels (kernels/hip/attn_bwd.hpp) on the CPU wave64 model for a validated
// problem, as the HIP backend would launch them on a GPU: the same parameters, grids, blocks and LDS
// sizes, the three kernels in stream order, the fp32 workspaces allocated (and poisoned) here.
#pragma once

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "hip/attn_bwd.hpp"

namespace flashport::test::hipmodel {

template <class Elem, int kBucket>
void backward_bucket(const amd::BwdParams& prm) {
  using K = amd::bwd::Kernel<Elem, kBucket>;
  using R = amd::bwd::RowKernel<Elem>;
  const AttnProblem& p = prm.p;
  if (p.batch == 0 || p.hq == 0) return;
  const wave::model::Dim3 rows{(unsigned)((p.sq + R::kRows - 1) / R::kRows), (unsigned)p.hq,
                               (unsigned)p.batch};
  const long long tiles = amd::bwd_key_tiles(p, kBucket);
  const wave::model::Dim3 keys{(unsigned)(p.deterministic ? prm.num_slices : tiles), (unsigned)p.hk,
                               (unsigned)p.batch};
  if (rows.x > 0) wave::model::launch(rows, R::kThreads, 0, [&](unsigned char*) { R::dot_do_o(prm); });
  if (tiles > 0)
    wave::model::launch(keys, K::kThreads, K::kLdsBytes, [&](unsigned char* lds) { K::run(prm, lds); });
  if (rows.x > 0) wave::model::launch(rows, R::kThreads, 0, [&](unsigned char*) { R::convert_dq(prm); });
}

template <class Elem>
void backward_elem(const amd::BwdParams& prm, int bucket) {
  switch (bucket) {
    case 32:
      return backward_bucket<Elem, 32>(prm);
    case 64:
      return backward_bucket<Elem, 64>(prm);
    case 96:
      return backward_bucket<Elem, 96>(prm);
    case 128:
      return backward_bucket<Elem, 128>(prm);
    case 160:
      return backward_bucket<Elem, 160>(prm);
    case 256:
      return backward_bucket<Elem, 256>(prm);
    default:
      throw std::runtime_error("no model instantiation for head-dim bucket " + std::to_string(bucket));
  }
}

/// The backward of `p` (dout, grad_* and the LSE attached; fp16 or bf16, d and dv multiples of 8,
/// not paged) on the model; `vec` false forces the 2-byte load/store paths; deterministic problems get at
/// most `max_slices` dQ slices (few, so blocks visit several key tiles). The workspaces start as NaN so
/// a row the kernels forget to initialise cannot pass. Returns the fp32 dQ accumulator (its slices).
inline std::vector<float> backward(const AttnProblem& p, bool vec = true, int max_slices = 3) {
  if (p.d % 8 != 0 || p.dv % 8 != 0) throw std::runtime_error("the CDNA backward takes d, dv multiples of 8");
  if (p.block_table) throw std::runtime_error("the CDNA backward takes dense and varlen K/V");
  const int bucket = amd::bwd_head_dim_bucket(p.d, p.dv);
  const int slices = amd::bwd_num_slices(p, bucket, max_slices);
  std::vector<float> d_rows((size_t)amd::bwd_d_elems(p), NAN),
      dq_accum((size_t)(slices * amd::bwd_dq_slice_elems(p)), NAN);
  const amd::BwdParams prm{p, d_rows.data(), dq_accum.data(), slices, vec ? amd::bwd_vec_flags(p) : 0};
  if (p.in_type == kBF16)
    backward_elem<wave::bf16>(prm, bucket);
  else if (p.in_type == kF16)
    backward_elem<wave::f16>(prm, bucket);
  else
    throw std::runtime_error("the CDNA backward takes fp16 and bf16");
  return dq_accum;
}

}  // namespace flashport::test::hipmodel
