# Build options. GPU backends are tri-state: AUTO builds them when the toolchain is found,
# ON fails the configure when it is not, OFF never builds them.
set(KVOFFLOAD_CUDA AUTO CACHE STRING "Build the CUDA backend and kernels (AUTO|ON|OFF)")
set_property(CACHE KVOFFLOAD_CUDA PROPERTY STRINGS AUTO ON OFF)
set(KVOFFLOAD_HIP AUTO CACHE STRING "Build the HIP backend and kernels (AUTO|ON|OFF)")
set_property(CACHE KVOFFLOAD_HIP PROPERTY STRINGS AUTO ON OFF)

option(KVOFFLOAD_BUILD_TESTS "Build the GoogleTest suites" ON)
option(KVOFFLOAD_BUILD_BENCH "Build the Google Benchmark binaries" ON)
option(KVOFFLOAD_BUILD_PYTHON "Build the pybind11 module" ON)
# OFF: the interpreter the module is built for need not have numpy (`pip install .` sets it; the
# module does not need numpy, the tests do). See cmake/KvoffloadPython.cmake.
option(KVOFFLOAD_PYTHON_NEEDS_NUMPY "Require numpy in the Python the module is built for" ON)
option(KVOFFLOAD_WERROR "Treat warnings as errors" OFF)
# OFF: no `kvoffload exporter` subcommand, so no cpp-httplib (and what its .pc requires: OpenSSL,
# zlib, Brotli); for a host that lacks them, e.g. a GPU host's smoke run (tools/gpu-smoke.sh
# --no-exporter).
option(KVOFFLOAD_EXPORTER "Build the Prometheus exporter subcommand (needs cpp-httplib)" ON)
# OFF: no distributed tier (core/src/tier/remote: Redis, Redis Cluster, memcached), so no hiredis,
# libmemcached (and the libsasl2 its .pc requires), libxxhash or OpenSSL; for a host that lacks
# them, e.g. a GPU host's smoke run (tools/gpu-smoke.sh --no-remote-tier). The library keeps its
# API: a remote URL given to such a build is refused with ErrorCode::kNotAvailable, "this build
# has no remote tier; rebuild with -DKVOFFLOAD_REMOTE_TIER=ON" (Note [Built without the remote
# tier] in core/src/tier/remote/remote_tier_absent.cpp).
option(KVOFFLOAD_REMOTE_TIER "Build the remote tier (needs hiredis, libmemcached, libxxhash, OpenSSL)" ON)
set(KVOFFLOAD_SANITIZE "" CACHE STRING "Sanitizers: empty, 'address;undefined' or 'thread'")

set(KVOFFLOAD_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures for the kernels")
# MI200 (gfx90a) and MI300 (gfx942). A compiler that does not know an architecture (Debian's ROCm 5.2
# clang predates gfx942) gets it dropped with a warning at configure time: see KvoffloadGpu.cmake.
set(KVOFFLOAD_HIP_ARCHITECTURES "gfx90a;gfx942" CACHE STRING "HIP offload architectures for the kernels")

# Precompiled headers for the heavy third-party headers (spdlog/fmt, CLI11, nlohmann-json,
# GoogleTest, pybind11): they dominate compile time on a 2-core CI machine. Off in the tidy preset
# (clang-tidy does not read GCC's precompiled headers).
option(KVOFFLOAD_PCH "Use precompiled headers" ON)
function(kvoffload_precompile target)
  if(KVOFFLOAD_PCH)
    target_precompile_headers(${target} PRIVATE ${ARGN})
  endif()
endfunction()

# Warnings for our own targets only (third-party headers are SYSTEM includes: imported targets'
# include directories are SYSTEM, so -Werror never trips over spdlog, CLI11, GoogleTest or
# pybind11). The presets turn KVOFFLOAD_WERROR on, so CI fails on any warning; a plain configure
# leaves it off, so a newer compiler's new warning never breaks a user's or packager's build.
add_library(kvoffload_warnings INTERFACE)
target_compile_options(kvoffload_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers>
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wpedantic -Wshadow>
  $<$<AND:$<COMPILE_LANGUAGE:C,CXX>,$<BOOL:${KVOFFLOAD_WERROR}>>:-Werror>)

if(KVOFFLOAD_SANITIZE)
  list(JOIN KVOFFLOAD_SANITIZE "," _kvo_san)
  message(STATUS "kvoffload: sanitizers ${_kvo_san}")
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${_kvo_san}>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=${_kvo_san})
endif()
