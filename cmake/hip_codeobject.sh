#!/usr/bin/env bash
# Compiles one HIP kernel variant for one AMD architecture and checks the code object: no scratch
# (private segment 0), no VGPR spills, LDS within 64 KiB, and MFMA instructions in the disassembly.
# SGPR spills go to VGPR lanes (v_writelane, no memory) and are reported, not failed.
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
field() { echo "$notes" | grep -m1 -E "\.$1:" | awk '{print $NF}'; }
private=$(field private_segment_fixed_size) vspill=$(field vgpr_spill_count) sspill=$(field sgpr_spill_count)
lds=$(field group_segment_fixed_size) vgpr=$(field vgpr_count) agpr=$(field agpr_count) sgpr=$(field sgpr_count)
mfma=$("$llvm/llvm-objdump" -d --mcpu="$arch" "$tmp/k.co" | grep -c 'v_mfma' || true)
summary="$(basename "$out"): vgpr $vgpr agpr ${agpr:-0} sgpr $sgpr, sgpr spills (to VGPR lanes) $sspill, lds $lds, mfma $mfma"
fail() { echo "hip_codeobject: $summary: $*" >&2; exit 1; }
[ "$private" = 0 ] || fail "uses $private bytes of scratch per lane"
[ "$vspill" = 0 ] || fail "spills $vspill VGPRs"
[ "$lds" -le 65536 ] || fail "LDS above 64 KiB"
[ "$mfma" -gt 0 ] || fail "no v_mfma instruction in the disassembly"
mv "$tmp/k.co" "$out"
echo "$summary" >"$out.txt"
