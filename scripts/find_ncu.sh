# Sourced by the Nsight Compute scripts (ncu_hopper_fwd.sh, ncu_decode.sh, gpu_suite.sh's ncusrc step):
# find_ncu prints the ncu binary to use, or nothing: $NCU when set (and executable), else ncu on PATH, else
# the newest /opt/nvidia/nsight-compute/*/ncu, else the toolkit's /usr/local/cuda/bin/ncu.
find_ncu() {
  if [[ -n "${NCU:-}" ]]; then [[ -x "$NCU" ]] && echo "$NCU"; return; fi
  command -v ncu 2>/dev/null && return
  local c
  c=$(printf '%s\n' /opt/nvidia/nsight-compute/*/ncu | sort -V | tail -1)
  [[ -x "$c" ]] && { echo "$c"; return; }
  [[ -x /usr/local/cuda/bin/ncu ]] && echo /usr/local/cuda/bin/ncu
}
