# Finds the GPU toolchains.
#
# CUDA: the CUDA language through check_language (nvcc under /usr/local/cuda is found even when it
# is not on PATH). HIP: the HIP language when CMake can enable it (a full ROCm install); otherwise,
# with Debian's hipcc + libamdhip64-dev, CMake 3.25's HIP language cannot work (it expects hip-lang
# under lib/cmake and its try_compile cannot find amd_comgr), so kernels are compiled by calling
# hipcc directly (kvoffload_hipcc_objects below) and host code links hip::host from find_package(hip).
include(CheckLanguage)

set(KVOFFLOAD_WITH_CUDA OFF)
set(KVOFFLOAD_WITH_HIP OFF)
set(KVOFFLOAD_HIP_MODE "")

if(NOT KVOFFLOAD_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_kvo_nvcc nvcc HINTS $ENV{CUDA_HOME}/bin $ENV{CUDA_PATH}/bin /usr/local/cuda/bin)
    if(_kvo_nvcc)
      set(CMAKE_CUDA_COMPILER ${_kvo_nvcc} CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
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
    find_package(CUDAToolkit REQUIRED)
    set(KVOFFLOAD_WITH_CUDA ON)
  elseif(KVOFFLOAD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVOFFLOAD_CUDA=ON but no CUDA compiler was found; install the CUDA "
                        "toolkit or set CMAKE_CUDA_COMPILER, or configure with -DKVOFFLOAD_CUDA=OFF")
  endif()
endif()

if(NOT KVOFFLOAD_HIP STREQUAL "OFF")
  check_language(HIP)
  if(CMAKE_HIP_COMPILER)
    if(NOT DEFINED CMAKE_HIP_ARCHITECTURES)
      set(CMAKE_HIP_ARCHITECTURES ${KVOFFLOAD_HIP_ARCHITECTURES})
    endif()
    enable_language(HIP)
    set(CMAKE_HIP_STANDARD 17)  # as CMAKE_CUDA_STANDARD above: the kernels are C++17
    find_package(hip CONFIG REQUIRED)
    set(KVOFFLOAD_WITH_HIP ON)
    set(KVOFFLOAD_HIP_MODE "language")
  else()
    find_program(KVOFFLOAD_HIPCC hipcc HINTS $ENV{ROCM_PATH}/bin /opt/rocm/bin)
    find_package(hip CONFIG QUIET)
    if(KVOFFLOAD_HIPCC AND hip_FOUND)
      set(KVOFFLOAD_WITH_HIP ON)
      set(KVOFFLOAD_HIP_MODE "hipcc")
    endif()
  endif()
  if(NOT KVOFFLOAD_WITH_HIP AND KVOFFLOAD_HIP STREQUAL "ON")
    message(FATAL_ERROR "KVOFFLOAD_HIP=ON but neither the HIP language nor hipcc + the hip CMake "
                        "package were found; install ROCm (or Debian's hipcc libamdhip64-dev), or "
                        "configure with -DKVOFFLOAD_HIP=OFF")
  endif()
endif()

# hipcc mode: keep the requested architectures the compiler knows (one tiny compile each), so the
# MI300 default does not break a build with an older ROCm; the warning says what was dropped.
if(KVOFFLOAD_HIP_MODE STREQUAL "hipcc")
  set(_kvo_probe ${CMAKE_BINARY_DIR}/kvo_hip_arch_probe.hip)
  file(WRITE ${_kvo_probe} "__attribute__((global)) void kvo_probe(int* p) { *p = 1; }\n")
  set(_kvo_archs)
  foreach(arch IN LISTS KVOFFLOAD_HIP_ARCHITECTURES)
    if(NOT DEFINED KVOFFLOAD_HIP_ARCH_OK_${arch})
      execute_process(COMMAND ${KVOFFLOAD_HIPCC} -x hip --offload-arch=${arch} --cuda-device-only -nogpuinc
                              -c ${_kvo_probe} -o ${CMAKE_BINARY_DIR}/kvo_hip_arch_probe.o
                      RESULT_VARIABLE _kvo_rc OUTPUT_QUIET ERROR_QUIET)
      if(_kvo_rc EQUAL 0)
        set(KVOFFLOAD_HIP_ARCH_OK_${arch} ON CACHE INTERNAL "")
      else()
        set(KVOFFLOAD_HIP_ARCH_OK_${arch} OFF CACHE INTERNAL "")
      endif()
    endif()
    if(KVOFFLOAD_HIP_ARCH_OK_${arch})
      list(APPEND _kvo_archs ${arch})
    else()
      message(WARNING "kvoffload: hipcc (${KVOFFLOAD_HIPCC}) does not know --offload-arch=${arch}; "
                      "building the HIP kernels without it (a newer ROCm knows it)")
    endif()
  endforeach()
  if(NOT _kvo_archs)
    message(FATAL_ERROR "kvoffload: hipcc knows none of KVOFFLOAD_HIP_ARCHITECTURES=${KVOFFLOAD_HIP_ARCHITECTURES}")
  endif()
  set(KVOFFLOAD_HIP_ARCHITECTURES_BUILT ${_kvo_archs})
else()
  set(KVOFFLOAD_HIP_ARCHITECTURES_BUILT ${KVOFFLOAD_HIP_ARCHITECTURES})
endif()
if(KVOFFLOAD_WITH_HIP)
  find_path(KVOFFLOAD_ROCPRIM_INCLUDE rocprim/rocprim.hpp HINTS $ENV{ROCM_PATH}/include /opt/rocm/include /usr/include)
  if(NOT KVOFFLOAD_ROCPRIM_INCLUDE)
    message(FATAL_ERROR "kvoffload: the HIP kernels need rocPRIM (Debian: librocprim-dev; ROCm: rocprim)")
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
