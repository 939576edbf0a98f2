#!/usr/bin/env bash
# Compiles one HIP kernel variant for one AMD architecture and checks the code object: no scratch
# (private segment 0), no VGPR spills, LDS within 64 KiB, and MFMA instructions in the disassembly.
# SGPR spills go to VGPR lanes (v_writelane, no memory) and are reported, not failed. A code object
# with several kernels is checked on the largest value of each field.
# Environment: FP_HIP_NO_MFMA=1 for a kernel without matrix math (skips the v_mfma check);
# FP_HIP_NO_FMA=1 fails on a fused multiply-add (a kernel whose results must round like the CPU's),
# apart from the +-2^32 v_mac_f32 of the compiler's own 64-bit integer division.
# Usage: hip_codeobject.sh <arch> <output .co> <llvm-19 bin dir> <compiler command...>
# Writes <output .co> and <output .co>.txt (the resource summary).
set -euo pipefail
arch=$1 out=$2 llvm=$3
shift 3
tmp=$(mktemp -d "${out}.XXXX")
trap 'rm -rf "$tmp"' EXIT
"$@" -c -o "$tmp/k.o"
"$llvm/llvm-objcopy" --dump-section=.hip_fatbin="$tmp/fatbin" "$tmp/k.o"
"$llvm/clang-offload-bundler" --unbundle --type=o --input="$tmp/fatbin" \
  --targets="hipv4-amdgcn-amd-amdhsa--$arch" --output="$tmp/k.co"
notes=$("$llvm/llvm-readelf" --notes "$tmp/k.co")
field() { echo "$notes" | grep -E "\.$1:" | awk '{print $NF}' | sort -n | tail -1; }
private=$(field private_segment_fixed_size) vspill=$(field vgpr_spill_count) sspill=$(field sgpr_spill_count)
lds=$(field group_segment_fixed_size) vgpr=$(field vgpr_count) agpr=$(field agpr_count) sgpr=$(field sgpr_count)
disasm=$("$llvm/llvm-objdump" -d --mcpu="$arch" "$tmp/k.co")
mfma=$(echo "$disasm" | grep -c 'v_mfma' || true)
fma=$(echo "$disasm" | grep -E 'v_(fma|fmac|mac|mad)_f32|v_pk_fma|v_fma_mix' | grep -vcE '0x[4c]f800000' || true)
summary="$(basename "$out"): vgpr $vgpr agpr ${agpr:-0} sgpr $sgpr, sgpr spills (to VGPR lanes) $sspill, lds $lds, mfma $mfma"
fail() { echo "hip_codeobject: $summary: $*" >&2; exit 1; }
[ "$private" = 0 ] || fail "uses $private bytes of scratch per lane"
[ "$vspill" = 0 ] || fail "spills $vspill VGPRs"
[ "$lds" -le 65536 ] || fail "LDS above 64 KiB"
[ "${FP_HIP_NO_MFMA:-0}" = 1 ] || [ "$mfma" -gt 0 ] || fail "no v_mfma instruction in the disassembly"
[ "${FP_HIP_NO_FMA:-0}" = 0 ] || [ "$fma" = 0 ] || fail "$fma fused multiply-adds (FP contraction must be off)"
mv "$tmp/k.co" "$out"
echo "$summary" >"$out.txt"
