#!/usr/bin/env bash
# Fails when a tracked C, C++ or CUDA source differs from what clang-format-14 makes of it (.clang-format at
# the root). Nothing is excluded. Pinned to version 14 (Debian 12's) because other versions format some
# constructs differently. Fix with: git ls-files <the patterns below> | xargs clang-format-14 -i
# Usage: scripts/check_format.sh [clang-format binary]
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=${1:-clang-format-14}
if ! command -v "$fmt" >/dev/null; then
  echo "check_format: $fmt not found (Debian: apt-get install clang-format-14)" >&2
  exit 2
fi
files=()
while IFS= read -r -d '' f; do files+=("$f"); done < <(
  git ls-files -z -- '*.c' '*.cc' '*.cpp' '*.cxx' '*.h' '*.hh' '*.hpp' '*.cu' '*.cuh')
if [ ${#files[@]} -eq 0 ]; then
  echo "check_format: no sources found" >&2
  exit 2
fi
if printf '%s\0' "${files[@]}" | xargs -0 "$fmt" --dry-run -Werror; then
  echo "check_format: ${#files[@]} files formatted"
else
  echo "check_format: files above differ from $fmt's formatting" >&2
  exit 1
fi
