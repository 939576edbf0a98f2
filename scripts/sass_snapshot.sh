#!/usr/bin/env bash
# SASS of every kernel variant (src/backends/cuda/variants.cpp, sm_80 and sm_90a), for checking that a
# change which only moves code leaves the kernels byte-identical. No GPU needed (NVRTC + cuobjdump).
#
#   scripts/sass_snapshot.sh take DIR [BUILD_DIR]   compile every variant into DIR/<key>.cubin + .sass
#                                                   ($ONLY: space-separated key substrings, a subset)
#   scripts/sass_snapshot.sh diff OLD NEW           per kernel of NEW: identical / differs, exit 1 if any differ
#   scripts/sass_snapshot.sh ops OLD NEW            of the kernels that differ: opcode counts per family
#                                                   (reordering only / integer bookkeeping / main loops)
#
# `take` uses the build's embedded sources (rebuild first) and the regular kernel cache, so kernels whose
# sources did not change come from the cache. The .sass files drop cuobjdump's file-name lines, so two
# snapshots compare by content only.
set -euo pipefail

# cuobjdump: $CUOBJDUMP, else PATH, the toolkit, or the copy Triton ships.
find_cuobjdump() {
  command -v cuobjdump && return
  for c in /usr/local/cuda/bin/cuobjdump \
    "$(python3 -c 'import triton, os; print(os.path.dirname(triton.__file__))' 2>/dev/null)/backends/nvidia/bin/cuobjdump"; do
    [[ -x $c ]] && echo "$c" && return
  done
  echo "sass_snapshot.sh: no cuobjdump (set CUOBJDUMP)" >&2
  exit 1
}
CUOBJDUMP=${CUOBJDUMP:-$(find_cuobjdump)}

take() {
  local dir=$1 build=${2:-build}
  mkdir -p "$dir"
  rm -f "$dir"/*.cubin "$dir"/*.sass
  local only=()
  for text in ${ONLY:-}; do only+=(--only "$text"); done
  "$build/src/jit/flashport-prebuild" --arch 80,90 -j "${JOBS:-$(nproc)}" --dump "$dir" "${only[@]}" >"$dir/prebuild.log"
  for cubin in "$dir"/*.cubin; do
    # Keep the function header and the instructions; drop the lines that name the input file.
    "$CUOBJDUMP" -sass "$cubin" | grep -vF -- "$(basename "$cubin")" >"${cubin%.cubin}.sass"
  done
  echo "$(ls "$dir"/*.sass | wc -l) kernels in $dir"
}

diff_dirs() {
  local old=$1 new=$2 same=0 differ=0 added=0
  for b in "$new"/*.sass; do
    local name a
    name=$(basename "$b")
    a="$old/$name"
    if [[ ! -f $a ]]; then
      echo "new       ${name%.sass}"
      added=$((added + 1))
    elif cmp -s "$a" "$b"; then
      same=$((same + 1))
    else
      # Count differing instructions with addresses and encodings stripped (an inserted instruction
      # shifts every later address).
      local n
      n=$(diff <(strip_sass "$a") <(strip_sass "$b") | grep -c '^[<>]' || true)
      echo "differs   ${name%.sass} ($n instruction lines)"
      differ=$((differ + 1))
    fi
  done
  local gone=0
  for a in "$old"/*.sass; do [[ -f "$new/$(basename "$a")" ]] || gone=$((gone + 1)); done
  echo "identical: $same, differ: $differ, new: $added, not in $new: $gone"
  [[ $differ -eq 0 ]]
}

strip_sass() {
  sed -E 's#/\*[0-9a-f]{4,}\*/##; s#/\* 0x[0-9a-f]+ \*/##; s/[[:space:]]+/ /g' "$1" | grep -v '^ *$'
}

case ${1:-} in
take) take "${@:2}" ;;
diff) diff_dirs "${@:2}" ;;
ops) python3 "$(dirname "$0")/sass_opcodes.py" "${@:2}" ;;
*)
  sed -n '2,13p' "$0"
  exit 2
  ;;
esac
