# GPU component: the one GPU runtime over a vendor table, the loader of the cuda/hip modules,
# and the simulated device (always built) with the copy kernel compiled for the host.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/gpu_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/backend_modules.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_kernel.cpp)
# The kernel's own source (kernels/copy_kernels.cu) is included by sim_kernel.cpp.
target_include_directories(kvoffload_objects PRIVATE ${PROJECT_SOURCE_DIR}/kernels ${PROJECT_SOURCE_DIR}/kernels/include)
# `#pragma unroll` is for nvcc/hipcc; GCC does not know it.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/sim/sim_kernel.cpp PROPERTIES
  COMPILE_OPTIONS "$<$<CXX_COMPILER_ID:GNU>:-Wno-unknown-pragmas>"
  SKIP_PRECOMPILE_HEADERS ON)
target_link_libraries(kvoffload_objects PUBLIC ${CMAKE_DL_LIBS})
