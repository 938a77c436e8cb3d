# Note [AUTO never fails a configure] (cmake/KvoffloadGpu.cmake), against fake toolchains: a CUDA
# toolkit older than 12.0, a hipcc that compiles nothing, a missing rocPRIM. With AUTO the
# configure succeeds and one line names what is missing; with ON it fails with that line.
#   cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch> -P gpu_toolchain_test.cmake
cmake_minimum_required(VERSION 3.25)
set(root ${WORK_DIR}/gpu_toolchain_test)
file(REMOVE_RECURSE ${root})
file(MAKE_DIRECTORY ${root}/project ${root}/bin ${root}/rocprim/rocprim)
file(WRITE ${root}/project/CMakeLists.txt
  "cmake_minimum_required(VERSION 3.25)\n"
  "project(gpu_toolchain_test LANGUAGES C CXX)\n"
  "list(APPEND CMAKE_MODULE_PATH ${SOURCE_DIR}/cmake)\n"
  "include(KvoffloadOptions)\ninclude(KvoffloadGpu)\n")
file(WRITE ${root}/bin/nvcc "#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
file(WRITE ${root}/bin/hipcc "#!/bin/sh\necho 'hipcc: cannot compile' >&2\nexit 1\n")
file(CHMOD ${root}/bin/nvcc ${root}/bin/hipcc PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
file(WRITE ${root}/rocprim/rocprim/rocprim.hpp "")

set(failures 0)
# expect(<name> <0|1: configure must fail> <text the output must hold> <cmake -D args...>)
function(expect name must_fail text)
  set(build ${root}/build-${name})
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${root}/project -B ${build} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps a FATAL_ERROR's text over lines: compare with runs of blanks folded.
  string(REGEX REPLACE "[ \n]+" " " all "${out}${err}")
  set(ok TRUE)
  if(must_fail AND rc EQUAL 0)
    set(ok FALSE)
    set(why "the configure succeeded")
  elseif(NOT must_fail AND NOT rc EQUAL 0)
    set(ok FALSE)
    set(why "the configure failed (rc ${rc})")
  endif()
  string(FIND "${all}" "${text}" at)
  if(at EQUAL -1)
    set(ok FALSE)
    set(why "${why} the output lacks '${text}'")
  endif()
  if(ok)
    message(STATUS "ok: ${name}")
  else()
    message(STATUS "FAILED: ${name}: ${why}\n${all}")
    math(EXPR n "${failures} + 1")
    set(failures ${n} PARENT_SCOPE)
  endif()
endfunction()

set(cuda_old -DKVOFFLOAD_HIP=OFF -DKVOFFLOAD_NVCC=${root}/bin/nvcc)
expect(cuda_auto_old 0 "CUDA backend skipped: ${root}/bin/nvcc is CUDA 11.8" -DKVOFFLOAD_CUDA=AUTO ${cuda_old})
expect(cuda_on_old 1 "KVOFFLOAD_CUDA=ON, but ${root}/bin/nvcc is CUDA 11.8" -DKVOFFLOAD_CUDA=ON ${cuda_old})

set(hip_base -DKVOFFLOAD_CUDA=OFF -DCMAKE_HIP_COMPILER= -DKVOFFLOAD_HIPCC=${root}/bin/hipcc)
expect(hip_auto_no_rocprim 0 "HIP backend skipped: the HIP kernels need rocPRIM" -DKVOFFLOAD_HIP=AUTO
       ${hip_base} "-DCMAKE_IGNORE_PATH=/usr/include\;/opt/rocm/include")
expect(hip_on_no_rocprim 1 "KVOFFLOAD_HIP=ON, but the HIP kernels need rocPRIM" -DKVOFFLOAD_HIP=ON
       ${hip_base} "-DCMAKE_IGNORE_PATH=/usr/include\;/opt/rocm/include")
expect(hip_auto_broken_hipcc 0 "HIP backend skipped: hipcc (${root}/bin/hipcc) knows none of"
       -DKVOFFLOAD_HIP=AUTO ${hip_base} -DKVOFFLOAD_ROCPRIM_INCLUDE=${root}/rocprim)

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} toolchain case(s) failed")
endif()
file(REMOVE_RECURSE ${root})
