#!/usr/bin/env bash
# Makes the device-library folder clang-19 needs to build gfx942 code objects with Debian's HIP 5.2
# bitcode: every .bc of the system folder linked in, plus oclc_isa_version_942.bc, which HIP 5.2 lacks.
# The latter is the gfx90a file with the ISA version constant changed (9010 -> 9402), disassembled and
# reassembled by LLVM 19, so its datalayout is the one LLVM 19 expects. Generated, never committed.
# Usage: hip_devlib.sh <system bitcode dir> <output dir> <llvm-19 bin dir>
set -euo pipefail
src=$1 out=$2 llvm=$3
mkdir -p "$out"
for f in "$src"/*.bc; do ln -sf "$f" "$out/"; done
"$llvm/llvm-dis" -o - "$src/oclc_isa_version_90a.bc" | sed 's/i32 9010,/i32 9402,/' >"$out/oclc_isa_version_942.ll"
grep -q 'i32 9402,' "$out/oclc_isa_version_942.ll" || { echo "hip_devlib: ISA constant not found in the gfx90a file" >&2; exit 1; }
"$llvm/llvm-as" -o "$out/oclc_isa_version_942.bc" "$out/oclc_isa_version_942.ll"
