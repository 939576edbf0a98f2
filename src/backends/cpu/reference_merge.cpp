// The CPU merge of two partial attention states by their log-sum-exp (memory-bound; one implementation).
#include <algorithm>
#include <cmath>

#include "backends/cpu/elem.hpp"
#include "backends/cpu/reference.hpp"

namespace flashport::cpu::ref {

void merge_states(const core::MergeProblem& mp) {
  const auto offset = [](const Operand& t, long long b, long long s, long long h) {
    return b * t.batch_stride + s * t.row_stride + h * t.head_stride;
  };
  const long long rows = mp.batch * mp.heads * mp.seqlen;
#pragma omp parallel for schedule(static)
  for (long long r = 0; r < rows; ++r) {
    const long long b = r / (mp.heads * mp.seqlen), h = (r / mp.seqlen) % mp.heads, s = r % mp.seqlen;
    // Read both LSEs before anything is written: out/lse may alias either input.
    const double lse_a = mp.lse_a[r], lse_b = mp.lse_b[r];
    const double m = std::max(lse_a, lse_b);
    const double w_a = sem::lse_weight(lse_a, m), w_b = sem::lse_weight(lse_b, m);
    const double w_sum = w_a + w_b;
    const long long a_off = offset(mp.a, b, s, h), b_off = offset(mp.b, b, s, h),
                    o_off = offset(mp.out, b, s, h);
    // A state of weight 0 (LSE -inf) is skipped, so its (possibly unwritten) output cannot leak NaN.
    for (long long c = 0; c < mp.d; ++c) {
      double merged = 0.0;
      if (w_a > 0.0) merged += w_a * load_f64(mp.a.ptr, mp.type, a_off + c);
      if (w_b > 0.0) merged += w_b * load_f64(mp.b.ptr, mp.type, b_off + c);
      store(mp.out.ptr, mp.type, o_off + c, w_sum > 0.0 ? merged / w_sum : 0.0);
    }
    if (mp.lse) mp.lse[r] = w_sum > 0.0 ? (float)(m + std::log(w_sum)) : sem::kNegInf;
  }
}

}  // namespace flashport::cpu::ref
