# FLASHPORT_HIP=ON: every HIP kernel variant compiled to a code object for gfx90a (Debian's hipcc 5.2)
# and gfx942 (clang-19 with the HIP 5.2 headers and a generated device-library file), each checked by
# cmake/hip_codeobject.sh (every kernel: no scratch, no VGPR spills, LDS <= 64 KiB; v_mfma present).
# The compilers are driven directly: CMake 3.25's HIP language does not find Debian's HIP files. Nothing
# here runs the code (no AMD GPU); the kernels execute on the CPU wave64 model in tests/hip (label hip).
find_program(FLASHPORT_HIPCC hipcc REQUIRED)
find_program(FLASHPORT_CLANG19 clang++-19 REQUIRED)
set(FLASHPORT_LLVM19_BIN /usr/lib/llvm-19/bin CACHE PATH "LLVM 19 tools (objcopy, offload bundler, objdump, readelf)")
set(FLASHPORT_HIP_BITCODE /usr/lib/x86_64-linux-gnu/amdgcn/bitcode CACHE PATH "HIP 5.2 device-library bitcode")
set(FLASHPORT_HIP_ARCHS gfx90a gfx942 CACHE STRING "AMD architectures to compile for (gfx90a: hipcc, gfx94x: clang-19)")

set(hip_out ${CMAKE_BINARY_DIR}/hip)
set(devlib ${hip_out}/devlib)
add_custom_command(OUTPUT ${devlib}/oclc_isa_version_942.bc
  COMMAND bash ${PROJECT_SOURCE_DIR}/cmake/hip_devlib.sh ${FLASHPORT_HIP_BITCODE} ${devlib} ${FLASHPORT_LLVM19_BIN}
  DEPENDS ${PROJECT_SOURCE_DIR}/cmake/hip_devlib.sh
  COMMENT "HIP: device libraries for gfx942")

file(GLOB hip_deps CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/kernels/hip/* ${PROJECT_SOURCE_DIR}/src/kernels/wave/*.hpp
  ${PROJECT_SOURCE_DIR}/src/core/*.h)
# The head-dim buckets come from the kernels' own tables (attn_fwd_config.hpp, attn_bwd_config.hpp), so each
# list is written once: hip_table(OUT FILE NAME) sets OUT to the entries of `NAME[] = {...}` in FILE.
function(hip_table out file name)
  file(READ ${PROJECT_SOURCE_DIR}/src/kernels/hip/${file} text)
  string(REGEX MATCH "${name}\\[\\] = {([0-9, ]+)}" _ "${text}")
  string(REPLACE ", " ";" entries "${CMAKE_MATCH_1}")
  if(NOT entries)
    message(FATAL_ERROR "cmake/hip_kernels.cmake: ${name} not found in ${file}")
  endif()
  set(${out} "${entries}" PARENT_SCOPE)
endfunction()
hip_table(hip_buckets attn_fwd_config.hpp kFwdBuckets)
hip_table(hip_dropout_buckets attn_fwd_config.hpp kFwdDropoutBuckets)
hip_table(hip_fp8_buckets attn_fwd_config.hpp kFwdFp8Buckets)
hip_table(hip_bwd_buckets attn_bwd_config.hpp kBwdBuckets)

set(common -O3 -std=c++20 -I${PROJECT_SOURCE_DIR}/src -I${PROJECT_SOURCE_DIR}/src/kernels)
set(code_objects "")
# One code object <arch>/<name>.co of src/kernels/hip/<source>, compiled with the arch's compiler
# (${compiler}, ${extra_deps}) and checked by hip_codeobject.sh; ARGN: extra compiler flags. ENV: an
# optional `ENV VAR=1 ...` list of the check's switches (FP_HIP_NO_MFMA, FP_HIP_NO_FMA).
function(hip_code_object arch name source)
  cmake_parse_arguments(arg "" "" "ENV;FLAGS" ${ARGN})
  set(co ${hip_out}/${arch}/${name}.co)
  add_custom_command(OUTPUT ${co}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${hip_out}/${arch}
    COMMAND ${CMAKE_COMMAND} -E env ${arg_ENV}
            bash ${PROJECT_SOURCE_DIR}/cmake/hip_codeobject.sh ${arch} ${co} ${FLASHPORT_LLVM19_BIN}
            ${compiler} ${common} ${arg_FLAGS} ${PROJECT_SOURCE_DIR}/src/kernels/hip/${source}
    DEPENDS ${hip_deps} ${extra_deps} ${PROJECT_SOURCE_DIR}/cmake/hip_codeobject.sh
    COMMENT "HIP: ${name} for ${arch}")
  set(code_objects ${code_objects} ${co} PARENT_SCOPE)
endfunction()

foreach(arch IN LISTS FLASHPORT_HIP_ARCHS)
  if(arch STREQUAL "gfx90a")
    set(compiler ${FLASHPORT_HIPCC} --offload-arch=${arch})
    set(extra_deps "")
  else()
    set(compiler ${FLASHPORT_CLANG19} -x hip --offload-arch=${arch} --rocm-path=/usr --rocm-device-lib-path=${devlib})
    set(extra_deps ${devlib}/oclc_isa_version_942.bc)
  endif()
  # Every forward variant twice: attn_fwd_* and attn_fwd_split_* (FP_SPLIT=1: the split-KV entry
  # attn_fwd_split, in objects of its own so that attn_fwd's code stays as it is).
  foreach(split "" _split)
    set(split_flags "")
    if(split)
      set(split_flags -DFP_SPLIT=1)
    endif()
    foreach(elem bf16 f16)
      foreach(bucket IN LISTS hip_buckets)
        hip_code_object(${arch} attn_fwd${split}_${elem}_d${bucket} attn_fwd.hip
                        FLAGS -DFP_ELEM=${elem} -DFP_HEADDIM=${bucket} ${split_flags})
      endforeach()
      # The dropout variants (FP_DROPOUT=1) of the buckets kFwdDropoutBuckets lists.
      foreach(bucket IN LISTS hip_dropout_buckets)
        hip_code_object(${arch} attn_fwd${split}_dropout_${elem}_d${bucket} attn_fwd.hip
                        FLAGS -DFP_ELEM=${elem} -DFP_HEADDIM=${bucket} -DFP_DROPOUT=1 ${split_flags})
      endforeach()
    endforeach()
    # The fp8 forward (FP_FP8=1, bf16 MFMA over dequantised tiles): one object per bucket of
    # kFwdFp8Buckets serves e4m3fn, e4m3fnuz and e5m2 inputs and bf16 / f16 / f32 outputs.
    foreach(bucket IN LISTS hip_fp8_buckets)
      hip_code_object(${arch} attn_fwd${split}_fp8_d${bucket} attn_fwd.hip
                      FLAGS -DFP_ELEM=bf16 -DFP_HEADDIM=${bucket} -DFP_FP8=1 ${split_flags})
    endforeach()
  endforeach()
  # The backward: one code object per (dtype, bucket) with its three kernels (attn_bwd.hip).
  # -munsafe-fp-atomics: dQ's fp32 atomicAdd as global_atomic_add_f32 instead of a compare-and-swap
  # loop; valid for the coarse-grained (hipMalloc) memory of the dQ accumulator.
  foreach(elem bf16 f16)
    foreach(bucket IN LISTS hip_bwd_buckets)
      hip_code_object(${arch} attn_bwd_${elem}_d${bucket} attn_bwd.hip
                      FLAGS -munsafe-fp-atomics -DFP_ELEM=${elem} -DFP_HEADDIM=${bucket})
    endforeach()
  endforeach()
  # The split-KV combine (split_combine.hip): one code object for every dtype and head dim (the output
  # type is read at run time); no MFMA.
  hip_code_object(${arch} split_combine split_combine.hip ENV FP_HIP_NO_MFMA=1)
  # merge_states (merge_states.hip): one code object for every element type and head dim; no MFMA.
  hip_code_object(${arch} merge_states merge_states.hip ENV FP_HIP_NO_MFMA=1)
  # The index check (index_check.hip): one code object; no MFMA.
  hip_code_object(${arch} index_check index_check.hip ENV FP_HIP_NO_MFMA=1)
  # The KV-cache update (kv_append, rotate_q): one code object for both dtypes; no MFMA, and no fused
  # multiply-add (its rotary must round like the CPU backend's).
  hip_code_object(${arch} kvcache_append kvcache_append.hip ENV FP_HIP_NO_MFMA=1 FP_HIP_NO_FMA=1)
endforeach()
add_custom_target(hip_kernels ALL DEPENDS ${code_objects})
list(LENGTH code_objects n_code_objects)
message(STATUS "flashport: HIP kernels ON (${n_code_objects} code objects for ${FLASHPORT_HIP_ARCHS})")
