# Device runtime wing: the DeviceRuntime interface's factory, the host backend (cpu_stream,
# cpu_event), the fault-injecting decorator; gpu/ the one GPU runtime over a vendor table and the
# loader of the cuda/hip modules; sim/ the simulated device (always built) with the copy kernel
# compiled for the host. Nothing here knows the transfer engine: the engine is built on this.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/device_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_registration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_streams.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_device_memory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_dma.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu/gpu_kernel_path.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpu/backend_modules.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_memory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_stream.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_api.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_copy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim/sim_kernel.cpp)
# The kernel's own source (kernels/copy_kernels.cu) is included by sim_kernel.cpp.
target_include_directories(kvoffload_objects PRIVATE ${PROJECT_SOURCE_DIR}/kernels ${PROJECT_SOURCE_DIR}/kernels/include)
# `#pragma unroll` is for nvcc/hipcc; GCC does not know it.
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/sim/sim_kernel.cpp PROPERTIES
  COMPILE_OPTIONS "$<$<CXX_COMPILER_ID:GNU>:-Wno-unknown-pragmas>"
  SKIP_PRECOMPILE_HEADERS ON)
target_link_libraries(kvoffload_objects PUBLIC ${CMAKE_DL_LIBS})
# Which modules this build makes (Note [Not built vs not loadable] in gpu/backend_modules.cpp): a
# built one that does not load is an error naming the paths, never "not built". On this one file,
# so reconfiguring with a GPU backend recompiles one file.
# A module a previous configuration built stays in core/ when its backend is switched off, and
# every target's build RPATH would find it: removed, so the build tree holds only what it builds.
set(_kvo_built_cuda 0)
set(_kvo_built_hip 0)
if(KVOFFLOAD_WITH_CUDA)
  set(_kvo_built_cuda 1)
else()
  file(REMOVE ${PROJECT_BINARY_DIR}/core/libkvoffload_cuda.so)
endif()
if(KVOFFLOAD_WITH_HIP)
  set(_kvo_built_hip 1)
else()
  file(REMOVE ${PROJECT_BINARY_DIR}/core/libkvoffload_hip.so)
endif()
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/gpu/backend_modules.cpp PROPERTIES
  COMPILE_DEFINITIONS "KVOFFLOAD_BUILT_CUDA=${_kvo_built_cuda};KVOFFLOAD_BUILT_HIP=${_kvo_built_hip}")
