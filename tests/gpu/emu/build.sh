#!/bin/bash
# Builds the CUDA-kernel emulator test binary: the GPU suite (tests/gpu/test_*.cpp) linked against
# libflashport.a with jit:: replaced by emulated kernels (emu_runtime.cpp). No GPU needed.
# Usage: tests/gpu/emu/build.sh <cmake build dir with the CUDA backend ON> [arch (default 90)]
# Then:  FLASHPORT_EMU_LAZY_COPIES=0|1 <build>/emu/flashport_tests_emu --gtest_filter=...
# ctest runs both under the label `emu` when the build is configured with -DFLASHPORT_GPU_EMU=ON
# (`make test-emu`). CUDA_INCLUDE / CUDA_LIB: the toolkit's include and library directories (the CUDA
# runtime the GPU suite calls; default /usr/local/cuda/include and lib64).
set -euo pipefail
build=$(realpath "$1")
arch=${2:-90}
root=$(realpath "$(dirname "$0")/../../..")
emu=$root/tests/gpu/emu
cuda_inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
cuda_lib=${CUDA_LIB:-/usr/local/cuda/lib64}
out=$build/emu
mkdir -p "$out"
rm -f "$out"/*.o
ninja -C "$build" flashport >/dev/null || { echo "building libflashport.a failed: ninja -C $build flashport"; exit 1; }
cxx="ccache g++"
command -v ccache >/dev/null || cxx=g++
# SANITIZE=address: AddressSanitizer on the emulated kernels (device memory is host heap memory, so
# out-of-bounds global reads and writes of a kernel are reported).
san=${SANITIZE:+-fsanitize=$SANITIZE}
common="-std=c++20 -O1 -g -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas $san -I$root/include -I$root/src"
kernel_flags="$common -x c++ -include $emu/emu_cuda.hpp -I$emu -I$root/src/kernels"

g++ -std=c++20 -I$root/include -I$root/src -o "$out/list_variants" "$emu/list_variants.cpp" "$build/libflashport.a" -fopenmp -ldl -lpthread
jobs=()
i=0
while read -r flags; do
  jobs+=("$kernel_flags $flags -c $emu/emu_attn_fwd.cpp -o $out/attn_fwd_$i.o")
  i=$((i + 1))
done < <("$out/list_variants" "$arch")
while read -r flags; do
  jobs+=("$kernel_flags $flags -c $emu/emu_attn_fwd_f32.cpp -o $out/attn_fwd_f32_$i.o")
  i=$((i + 1))
done < <("$out/list_variants" "$arch" attn_fwd_f32)
while read -r flags; do
  jobs+=("$kernel_flags $flags -c $emu/emu_attn_bwd_f32.cpp -o $out/attn_bwd_f32_$i.o")
  i=$((i + 1))
done < <("$out/list_variants" "$arch" attn_bwd_f32)
# The Hopper kernels and the portable 16-bit backward: one object per variant their dispatchers list, each
# compiled from emu_variant.cpp with the header list_variants wrote (its defines, entry point and key).
rm -rf "$out/variants" && mkdir -p "$out/variants"
while read -r header; do
  jobs+=("$kernel_flags -Wno-maybe-uninitialized -Wno-psabi -include $header -c $emu/emu_variant.cpp \
    -o $out/$(basename "$header" .h).o")
done < <("$out/list_variants" "$arch" headers "$out/variants")
for k in split_combine kvcache merge bwd_aux fp8_scale fp8_v_transpose; do
  jobs+=("$kernel_flags -c $emu/emu_$k.cpp -o $out/$k.o")
done
# The backward's D / dQ-convert kernels in bf16 and f16 too (their 16-byte path; the Hopper backward's),
# entry points renamed to link.
for t in bf16 f16; do
  jobs+=("$kernel_flags -DFP_DTYPE=$t -Dattn_bwd_dot_do_o=attn_bwd_dot_do_o_$t \
    -Dattn_bwd_dq_convert=attn_bwd_dq_convert_$t -c $emu/emu_bwd_aux.cpp -o $out/bwd_aux_$t.o")
done
for f in emu_runtime emu_registry emu_sm90; do
  jobs+=("$common -I$emu -I$cuda_inc -c $emu/$f.cpp -o $out/$f.o")
done
for t in "$root"/tests/gpu/test_*.cpp; do
  case $(basename "$t") in test_fwd_*|test_merge_*|test_bwd_*|test_hopper_*) ;; *) continue ;; esac  # the kernels emulated here
  jobs+=("$common -DFLASHPORT_GPU_EMU=1 -I$root/tests -I$root/src/kernels -I$cuda_inc -c $t -o $out/$(basename "$t" .cpp).o")
done
printf '%s\n' "${jobs[@]}" | xargs -P "${JOBS:-2}" -I{} sh -c "$cxx {}"
$cxx $san -o "$out/flashport_tests_emu" "$out"/*.o "$build/libflashport.a" -lgtest -lgtest_main -fopenmp -ldl -lpthread \
  -L"$cuda_lib" -lcudart -Wl,-rpath,"$cuda_lib"
echo "built $out/flashport_tests_emu"
