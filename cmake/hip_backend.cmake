# FLASHPORT_HIP=ON, after cmake/hip_kernels.cmake: the HIP runtime backend in the library
# (src/backends/hip/*.cpp, libamdhip64 opened at run time) with every code object of the build embedded
# (cmake/hip_embed.cmake), and FLASHPORT_WITH_HIP for src/backends/registry.cpp.
set(hip_table ${CMAKE_BINARY_DIR}/hip/hip_code_objects.cpp)
set(hip_list ${CMAKE_BINARY_DIR}/hip/code_objects.txt)  # one path a line (a CMake list would split the command)
string(REPLACE ";" "\n" hip_lines "${code_objects}")
file(WRITE ${hip_list}.new "${hip_lines}\n")
file(COPY_FILE ${hip_list}.new ${hip_list} ONLY_IF_DIFFERENT)
add_custom_command(OUTPUT ${hip_table}
  COMMAND ${CMAKE_COMMAND} -DROOT=${hip_out} -DOUTPUT=${hip_table} -DLIST=${hip_list}
          -P ${PROJECT_SOURCE_DIR}/cmake/hip_embed.cmake
  DEPENDS ${code_objects} ${hip_list} ${PROJECT_SOURCE_DIR}/cmake/hip_embed.cmake
  COMMENT "HIP: embedding ${n_code_objects} code objects")
file(GLOB hip_backend_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/backends/hip/*.cpp)
target_sources(flashport PRIVATE ${hip_backend_sources} ${hip_table})
# Per source, not per target: the rest of the library compiles exactly as without HIP (so CI's
# `make hip` after `make test` recompiles only these).
set_source_files_properties(${hip_backend_sources} PROPERTIES INCLUDE_DIRECTORIES ${PROJECT_SOURCE_DIR}/src/kernels)
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/backends/registry.cpp PROPERTIES
                            COMPILE_DEFINITIONS FLASHPORT_WITH_HIP=1)
message(STATUS "flashport: HIP backend ON (libamdhip64 opened at run time)")
