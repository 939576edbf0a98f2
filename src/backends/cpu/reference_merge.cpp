// The CPU merge of two partial attention states by their log-sum-exp (memory-bound; one implementation).
#include <cmath>

#include "backends/cpu/elem.hpp"
#include "backends/cpu/reference.hpp"

namespace flashport::cpu::ref {

void merge_states(const core::MergeProblem& problem) {
  const MergeParams mp = core::merge_params(problem);
  const long long rows = mp.batch * mp.heads * mp.seqlen;
#pragma omp parallel for schedule(static)
  for (long long row = 0; row < rows; ++row) {
    const MergeRow r = merge_row(mp, row);  // reads both LSEs before anything is written (aliases)
    for (long long c = 0; c < mp.d; ++c) {
      double merged = 0.0;
      if (r.w_a > 0.0) merged += r.w_a * load_f64(mp.a.ptr, mp.type, r.a_off + c);
      if (r.w_b > 0.0) merged += r.w_b * load_f64(mp.b.ptr, mp.type, r.b_off + c);
      store(mp.out.ptr, mp.type, r.o_off + c, r.w_sum > 0.0 ? merged / r.w_sum : 0.0);
    }
    if (mp.lse) mp.lse[row] = r.lse;
  }
}

}  // namespace flashport::cpu::ref
