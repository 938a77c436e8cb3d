# Finds the GPU toolchains.
#
# Note [AUTO never fails a configure]
# KVOFFLOAD_CUDA / KVOFFLOAD_HIP are AUTO, ON or OFF. Every check below that can find a vendor's
# toolchain or libraries incomplete (no compiler, a compiler too old, a test compile that fails,
# no CUB or rocPRIM, no architecture the compiler knows) ends in kvoffload_gpu_missing(): with
# AUTO the backend is skipped and one line says what is missing; with ON the configure fails with
# that same line. So `cmake --preset gpu-auto`, the plain `cmake -S . -B build` and
# `tools/main.sh` configure on any machine, and a preset that asks for a backend says exactly why
# it cannot have it.
#
# CUDA: the CUDA language through check_language (nvcc under /usr/local/cuda is found even when it
# is not on PATH), toolkit 12.0 or newer. HIP: the HIP language when CMake can enable it (a full
# ROCm install); otherwise, with Debian's hipcc + libamdhip64-dev + librocprim-dev, CMake 3.25's
# HIP language cannot work (it expects hip-lang under lib/cmake and its try_compile cannot find
# amd_comgr), so kernels are compiled by calling hipcc directly (kvoffload_hipcc_objects below) and
# host code links hip::host from find_package(hip).
include(CheckLanguage)

set(KVOFFLOAD_WITH_CUDA OFF)
set(KVOFFLOAD_WITH_HIP OFF)
set(KVOFFLOAD_HIP_MODE "")
set(KVOFFLOAD_CUDA_MIN_VERSION 12.0)

# kvoffload_gpu_missing(CUDA|HIP <what is missing>): see Note [AUTO never fails a configure].
macro(kvoffload_gpu_missing vendor)
  string(CONCAT _kvo_why ${ARGN})
  if(KVOFFLOAD_${vendor} STREQUAL "ON")
    message(FATAL_ERROR "kvoffload: KVOFFLOAD_${vendor}=ON, but ${_kvo_why}; install what is "
                        "missing, or configure with -DKVOFFLOAD_${vendor}=AUTO (skip it) or OFF")
  endif()
  message(NOTICE "kvoffload: ${vendor} backend skipped: ${_kvo_why}")
endmacro()

# ---- CUDA ----
function(kvoffload_find_cuda)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(KVOFFLOAD_NVCC nvcc HINTS $ENV{CUDA_HOME}/bin $ENV{CUDA_PATH}/bin /usr/local/cuda/bin)
    if(NOT KVOFFLOAD_NVCC)
      kvoffload_gpu_missing(CUDA "no CUDA compiler: nvcc is not on PATH, in $CUDA_HOME/bin or in "
                                 "/usr/local/cuda/bin (install a CUDA toolkit >= ${KVOFFLOAD_CUDA_MIN_VERSION})")
      return()
    endif()
    set(nvcc ${KVOFFLOAD_NVCC})
  elseif(CMAKE_CUDA_COMPILER)
    set(nvcc ${CMAKE_CUDA_COMPILER})
  else()
    set(nvcc $ENV{CUDACXX})
  endif()
  # The version first: an older toolkit must be named as such, not fail a test compile later.
  execute_process(COMMAND ${nvcc} --version OUTPUT_VARIABLE out ERROR_QUIET RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "release ([0-9]+\\.[0-9]+)")
    kvoffload_gpu_missing(CUDA "${nvcc} --version did not run (a broken CUDA toolkit?)")
    return()
  endif()
  set(version ${CMAKE_MATCH_1})
  if(version VERSION_LESS KVOFFLOAD_CUDA_MIN_VERSION)
    kvoffload_gpu_missing(CUDA "${nvcc} is CUDA ${version}, but the CUDA backend needs CUDA "
                               "${KVOFFLOAD_CUDA_MIN_VERSION} or newer (12.x or 13.x)")
    return()
  endif()
  # check_language builds a test project with this nvcc (CUDACXX) and sets CMAKE_CUDA_COMPILER
  # only when that works, so enable_language(CUDA) below cannot fail the configure. (A compiler
  # given as -DCMAKE_CUDA_COMPILER is the user's choice and is not second-guessed.)
  if(NOT DEFINED CMAKE_CUDA_COMPILER)
    set(ENV{CUDACXX} ${nvcc})
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    kvoffload_gpu_missing(CUDA "nvcc ${version} (${nvcc}) cannot build a test program with this "
                               "host compiler (see CMakeFiles/CMakeError.log)")
    return()
  endif()
  set(KVOFFLOAD_CUDA_OK ON PARENT_SCOPE)
  set(KVOFFLOAD_CUDA_NVCC_VERSION ${version} PARENT_SCOPE)
endfunction()

if(NOT KVOFFLOAD_CUDA STREQUAL "OFF")
  kvoffload_find_cuda()
  if(KVOFFLOAD_CUDA_OK)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${KVOFFLOAD_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    # Every target whose objects include CUDA code (libkvoffload, and the tests and benchmarks
    # that link kvoffload_objects) gets CUDA flags from the Makefile generator, which derives the
    # CUDA dialect from the C++ one (cxx_std_20 -> CUDA20); CMake 3.25 knows no CUDA20 flag for
    # nvcc 13 and fails at generate time. The .cu sources are C++17, so say so for all targets.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit QUIET)
    # CUB comes with the toolkit: include/cub up to CUDA 12, include/cccl/cub from CUDA 13.
    find_path(KVOFFLOAD_CUB_INCLUDE cub/block/block_scan.cuh
              HINTS ${CUDAToolkit_INCLUDE_DIRS}/cccl ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cudart)
      kvoffload_gpu_missing(CUDA "nvcc ${KVOFFLOAD_CUDA_NVCC_VERSION} was found but not the CUDA "
                                 "runtime library (CUDAToolkit / CUDA::cudart)")
    elseif(NOT EXISTS ${CUDAToolkit_INCLUDE_DIRS}/cuda.h)
      kvoffload_gpu_missing(CUDA "the CUDA toolkit has no cuda.h under ${CUDAToolkit_INCLUDE_DIRS}")
    elseif(NOT KVOFFLOAD_CUB_INCLUDE)
      kvoffload_gpu_missing(CUDA "the CUDA toolkit has no CUB (cub/block/block_scan.cuh under "
                                 "${CUDAToolkit_INCLUDE_DIRS} or its cccl/)")
    else()
      set(KVOFFLOAD_WITH_CUDA ON)
    endif()
  endif()
endif()

# ---- HIP ----
# hipcc mode: keep the requested architectures the compiler knows (one tiny compile each), so the
# MI300 default does not break a build with an older ROCm; one line says what was dropped, and
# the runtime refuses a device whose architecture was dropped (GpuRuntime: kernel_archs).
function(kvoffload_hipcc_architectures out_var)
  set(probe ${CMAKE_BINARY_DIR}/kvo_hip_arch_probe.hip)
  file(WRITE ${probe} "__attribute__((global)) void kvo_probe(int* p) { *p = 1; }\n")
  set(archs)
  set(dropped)
  foreach(arch IN LISTS KVOFFLOAD_HIP_ARCHITECTURES)
    if(NOT DEFINED KVOFFLOAD_HIP_ARCH_OK_${arch})
      execute_process(COMMAND ${KVOFFLOAD_HIPCC} -x hip --offload-arch=${arch} --cuda-device-only -nogpuinc
                              -c ${probe} -o ${CMAKE_BINARY_DIR}/kvo_hip_arch_probe.o
                      RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
      if(rc EQUAL 0)
        set(KVOFFLOAD_HIP_ARCH_OK_${arch} ON CACHE INTERNAL "")
      else()
        set(KVOFFLOAD_HIP_ARCH_OK_${arch} OFF CACHE INTERNAL "")
      endif()
    endif()
    if(KVOFFLOAD_HIP_ARCH_OK_${arch})
      list(APPEND archs ${arch})
    else()
      list(APPEND dropped ${arch})
    endif()
  endforeach()
  if(dropped AND archs)
    list(JOIN dropped ", " d)
    message(NOTICE "kvoffload: hipcc (${KVOFFLOAD_HIPCC}) does not know ${d}: the HIP kernels are "
                   "built without it, and a GPU of that architecture is refused at run time "
                   "(a newer ROCm knows it)")
  endif()
  set(${out_var} ${archs} PARENT_SCOPE)
endfunction()

# One real compile of a HIP kernel that uses rocPRIM, for the first architecture, so an incomplete
# install (device libraries, headers) is found now rather than by the build.
function(kvoffload_hipcc_probe arch out_var)
  if(DEFINED KVOFFLOAD_HIPCC_PROBE_${arch})
    set(${out_var} "${KVOFFLOAD_HIPCC_PROBE_${arch}}" PARENT_SCOPE)
    return()
  endif()
  set(probe ${CMAKE_BINARY_DIR}/kvo_hip_probe.hip)
  file(WRITE ${probe} "#include <hip/hip_runtime.h>\n#include <rocprim/block/block_scan.hpp>\n"
                      "__global__ void kvo_probe(unsigned long long* p) {\n"
                      "  using scan = rocprim::block_scan<unsigned long long, 256>;\n"
                      "  __shared__ scan::storage_type s;\n  unsigned long long out = 0;\n"
                      "  scan().inclusive_scan(p[threadIdx.x], out, s);\n  p[threadIdx.x] = out;\n}\n")
  execute_process(COMMAND ${KVOFFLOAD_HIPCC} -x hip -std=c++17 --offload-arch=${arch} -I${KVOFFLOAD_ROCPRIM_INCLUDE}
                          -c ${probe} -o ${CMAKE_BINARY_DIR}/kvo_hip_probe.o
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0)
    set(result "")
  else()
    string(REGEX MATCH "[^\n]*error[^\n]*" first "${err}")
    set(result "hipcc cannot compile a HIP kernel with rocPRIM for ${arch}: ${first}")
  endif()
  set(KVOFFLOAD_HIPCC_PROBE_${arch} "${result}" CACHE INTERNAL "")
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

function(kvoffload_find_hip)
  find_path(KVOFFLOAD_ROCPRIM_INCLUDE rocprim/rocprim.hpp HINTS $ENV{ROCM_PATH}/include /opt/rocm/include /usr/include)
  check_language(HIP)
  if(CMAKE_HIP_COMPILER)
    set(mode language)
  else()
    find_program(KVOFFLOAD_HIPCC hipcc HINTS $ENV{ROCM_PATH}/bin /opt/rocm/bin)
    if(NOT KVOFFLOAD_HIPCC)
      kvoffload_gpu_missing(HIP "no HIP compiler: neither CMake's HIP language nor hipcc was found "
                                "(Debian: hipcc libamdhip64-dev librocprim-dev, or a ROCm install)")
      return()
    endif()
    set(mode hipcc)
    # hip-config links hip::host with compiler-rt's builtins, taking the first clang it globs
    # under /usr/lib/clang (any clang the machine has, e.g. an unrelated clang-14). Take those of
    # the clang hipcc itself runs, so what is linked is what install-deps installed with hipcc.
    if(NOT DEFINED CLANGRT_BUILTINS)
      execute_process(COMMAND ${KVOFFLOAD_HIPCC} --rtlib=compiler-rt -print-libgcc-file-name
                      OUTPUT_VARIABLE rt ERROR_QUIET RESULT_VARIABLE rc)
      string(STRIP "${rt}" rt)
      string(REGEX REPLACE ".*\n" "" rt "${rt}")
      if(rc EQUAL 0 AND EXISTS "${rt}")
        set(CLANGRT_BUILTINS ${rt} CACHE FILEPATH "compiler-rt builtins of hipcc's clang")
      endif()
    endif()
  endif()
  find_package(hip CONFIG QUIET)
  if(NOT hip_FOUND OR NOT TARGET hip::host)
    kvoffload_gpu_missing(HIP "the HIP compiler was found but not the HIP runtime's CMake package "
                              "(hip-config.cmake, Debian: libamdhip64-dev)")
    return()
  endif()
  if(NOT KVOFFLOAD_ROCPRIM_INCLUDE)
    kvoffload_gpu_missing(HIP "the HIP kernels need rocPRIM and rocprim/rocprim.hpp was not found "
                              "(Debian: librocprim-dev, ROCm: rocprim)")
    return()
  endif()
  if(mode STREQUAL "hipcc")
    kvoffload_hipcc_architectures(archs)
    if(NOT archs)
      kvoffload_gpu_missing(HIP "hipcc (${KVOFFLOAD_HIPCC}) knows none of "
                                "KVOFFLOAD_HIP_ARCHITECTURES=${KVOFFLOAD_HIP_ARCHITECTURES}")
      return()
    endif()
    list(GET archs 0 first)
    kvoffload_hipcc_probe(${first} why)
    if(why)
      kvoffload_gpu_missing(HIP "${why}")
      return()
    endif()
  else()
    set(archs ${KVOFFLOAD_HIP_ARCHITECTURES})
  endif()
  set(KVOFFLOAD_HIP_OK ON PARENT_SCOPE)
  set(KVOFFLOAD_HIP_MODE ${mode} PARENT_SCOPE)
  set(KVOFFLOAD_HIP_ARCHITECTURES_BUILT ${archs} PARENT_SCOPE)
endfunction()

if(NOT KVOFFLOAD_HIP STREQUAL "OFF")
  kvoffload_find_hip()
  if(KVOFFLOAD_HIP_OK)
    if(KVOFFLOAD_HIP_MODE STREQUAL "language")
      if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
        set(CMAKE_HIP_ARCHITECTURES ${KVOFFLOAD_HIP_ARCHITECTURES})
      endif()
      enable_language(HIP)
      set(CMAKE_HIP_STANDARD 17)  # as CMAKE_CUDA_STANDARD above: the kernels are C++17
    endif()
    set(KVOFFLOAD_WITH_HIP ON)
  endif()
endif()

message(STATUS "kvoffload: CUDA backend ${KVOFFLOAD_WITH_CUDA}, HIP backend ${KVOFFLOAD_WITH_HIP} ${KVOFFLOAD_HIP_MODE} ${KVOFFLOAD_HIP_ARCHITECTURES_BUILT}")

# kvoffload_hipcc_objects(<out-var> SOURCES a.cu ... INCLUDES dir ...)
# Compiles each source with hipcc into an object file and returns the object paths, to be added as
# sources of a library. Used only in "hipcc" mode.
function(kvoffload_hipcc_objects out_var)
  cmake_parse_arguments(ARG "" "" "SOURCES;INCLUDES;DEFINES" ${ARGN})
  set(objects)
  set(arch_flags)
  foreach(arch IN LISTS KVOFFLOAD_HIP_ARCHITECTURES_BUILT)
    list(APPEND arch_flags --offload-arch=${arch})
  endforeach()
  set(include_flags)
  foreach(dir IN LISTS ARG_INCLUDES)
    list(APPEND include_flags -I${dir})
  endforeach()
  set(define_flags)
  foreach(def IN LISTS ARG_DEFINES)
    list(APPEND define_flags -D${def})
  endforeach()
  foreach(src IN LISTS ARG_SOURCES)
    get_filename_component(abs ${src} ABSOLUTE)
    get_filename_component(name ${src} NAME_WE)
    set(obj ${CMAKE_CURRENT_BINARY_DIR}/hipcc/${name}.o)
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/hipcc
      COMMAND ${KVOFFLOAD_HIPCC} -x hip -std=c++17 -O3 -fPIC -fvisibility=hidden ${arch_flags} ${include_flags}
              ${define_flags} -MD -MF ${obj}.d -c ${abs} -o ${obj}
      DEPENDS ${abs}
      DEPFILE ${obj}.d
      COMMENT "hipcc ${name}"
      VERBATIM)
    list(APPEND objects ${obj})
  endforeach()
  set(${out_var} ${objects} PARENT_SCOPE)
endfunction()
