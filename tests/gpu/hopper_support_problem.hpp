// The problem the Hopper forward support tests start from (test_hopper_fwd.cpp, test_hopper_fwd_fp8.cpp)
// and change one field at a time: b 2, hq 4 / hk 2, d 128, 100 x 300, dense, 16-byte aligned (not
// dereferenced: unsupported() reads pointers and strides only).
#pragma once

#include <cstdint>

#include "core/problem.h"

namespace flashport::test::gpu {

inline AttnProblem hopper_support_problem(int in_type, int out_type) {
  AttnProblem p{};
  p.batch = 2, p.hq = 4, p.hk = 2, p.d = 128, p.dv = 128, p.sq = 100, p.sk = 300;
  p.in_type = in_type, p.out_type = out_type;
  void* aligned = reinterpret_cast<void*>(uintptr_t{1} << 20);
  p.q = {aligned, p.sq * p.hq * p.d, p.hq * p.d, p.d};
  p.k = {aligned, p.sk * p.hk * p.d, p.hk * p.d, p.d};
  p.v = p.k;
  p.o = p.q;
  p.scale = 0.1f;
  p.window_left = p.window_right = -1;
  return p;
}

}  // namespace flashport::test::gpu
