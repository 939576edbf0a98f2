// The CPU merge of two partial attention states by their log-sum-exp (memory-bound; one implementation).
#include <cmath>

#include "backends/cpu/elem.hpp"
#include "backends/cpu/reference.hpp"
#include "core/merge.h"

namespace flashport::cpu::ref {

void merge_states(const core::MergeProblem& problem) {
  const MergeParams mp = core::merge_params(problem);
  const long long rows = mp.batch * mp.heads * mp.seqlen;
#pragma omp parallel for schedule(static)
  for (long long row = 0; row < rows; ++row) {
    const MergeRow r = merge_row(mp, row);  // reads both LSEs before anything is written (aliases)
    merge_channels(mp, r, 0, 1);
    if (mp.lse) mp.lse[row] = r.lse;
  }
}

}  // namespace flashport::cpu::ref
