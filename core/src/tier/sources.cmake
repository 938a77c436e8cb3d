# Secondary tiers behind the host pool: the Tier interface and the tiered store over the manager;
# file/ the file tier (records, direct I/O, recovery, its I/O pool); remote/ the distributed tier.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tier.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tiered_store.cpp)
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/file/crc32c.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/io_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/file_record.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/direct_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/file_tier_recovery.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/file_tier.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/file_tier_space.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/file_tier_write.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file/file_tier_read.cpp)

# The distributed tier. Its configuration (URLs and their secrets, option validation, the check
# report's verdicts) has no dependency and is always in the library; the store clients are in
# their own object library, kvoffload_remote: Redis (standalone, Cluster) through hiredis,
# memcached through libmemcached, value checksums and the geometry fingerprint with libxxhash, TLS
# with OpenSSL (Debian: libhiredis-dev libmemcached-dev libxxhash-dev libssl-dev). Without
# KVOFFLOAD_REMOTE_TIER, kvoffload_remote_absent takes its place: the same symbols, refusing every
# remote URL (Note [Built without the remote tier]). The shared library and the INTERNAL suites
# link the one KVOFFLOAD_REMOTE_OBJECTS names; kvoffload_remote_absent is also built beside the
# real tier when tests are, for remote_absent_tests (the rest of the library links without the
# stores' libraries, and the refusal reads as documented).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/remote/remote_url.cpp
  ${CMAKE_CURRENT_LIST_DIR}/remote/remote_config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/remote/remote_check_report.cpp)

# An object library of the remote tier's own, compiled as kvoffload_objects' sources are.
function(kvoffload_remote_objects target)
  add_library(${target} OBJECT ${ARGN})
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR}/core/src)
  target_link_libraries(${target} PRIVATE kvoffload_objects kvoffload_warnings
                                          nlohmann_json::nlohmann_json)
endfunction()

if(KVOFFLOAD_REMOTE_TIER)
  find_package(PkgConfig)
  find_package(OpenSSL)
  set(_kvo_remote_missing)
  if(NOT PkgConfig_FOUND)
    list(APPEND _kvo_remote_missing "pkg-config (pkgconf)")
  else()
    pkg_check_modules(KVO_HIREDIS IMPORTED_TARGET hiredis)
    pkg_check_modules(KVO_MEMCACHED IMPORTED_TARGET libmemcached)
    pkg_check_modules(KVO_XXHASH IMPORTED_TARGET libxxhash)
    foreach(_kvo_dep HIREDIS:hiredis:libhiredis-dev MEMCACHED:libmemcached:libmemcached-dev
                     XXHASH:libxxhash:libxxhash-dev)
      string(REPLACE ":" ";" _kvo_dep "${_kvo_dep}")
      list(GET _kvo_dep 0 _kvo_var)
      list(GET _kvo_dep 1 _kvo_pc)
      list(GET _kvo_dep 2 _kvo_deb)
      if(NOT KVO_${_kvo_var}_FOUND)
        list(APPEND _kvo_remote_missing "${_kvo_pc} (${_kvo_deb})")
      endif()
    endforeach()
  endif()
  if(NOT OPENSSL_FOUND)
    list(APPEND _kvo_remote_missing "OpenSSL (libssl-dev)")
  endif()
  if(_kvo_remote_missing)
    list(JOIN _kvo_remote_missing ", " _kvo_remote_missing)
    message(FATAL_ERROR "kvoffload: the remote tier (KVOFFLOAD_REMOTE_TIER=ON) needs "
                        "${_kvo_remote_missing}, which this machine lacks (pkg-config found no .pc "
                        "for it, or one a .pc requires, e.g. libsasl2 for libmemcached). Install "
                        "them, or configure with -DKVOFFLOAD_REMOTE_TIER=OFF for a library without "
                        "the Redis/memcached tier.")
  endif()
  # xxHash's run-time dispatch (xxh_x86dispatch: the AVX2 / AVX-512 kernels where the CPU has
  # them) computes the same XXH3 values 2-3x faster than the SSE2 entry points; Debian's libxxhash
  # builds it in. Used for the values' payloads when this libxxhash has it.
  include(CheckCXXSourceCompiles)
  set(CMAKE_REQUIRED_LIBRARIES PkgConfig::KVO_XXHASH)
  check_cxx_source_compiles([[
#include <xxh_x86dispatch.h>
int main() { char b[4] = {0}; return static_cast<int>(XXH3_64bits_dispatch(b, sizeof b) & 1); }
]] KVOFFLOAD_HAVE_XXH3_DISPATCH)
  unset(CMAKE_REQUIRED_LIBRARIES)
  if(KVOFFLOAD_HAVE_XXH3_DISPATCH)
    set_property(SOURCE ${CMAKE_CURRENT_LIST_DIR}/remote/remote_value.cpp APPEND PROPERTY
                 COMPILE_DEFINITIONS KVOFFLOAD_HAVE_XXH3_DISPATCH=1)
  endif()
  kvoffload_remote_objects(kvoffload_remote
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_value.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_tls.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_redis.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_redis_replies.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_redis_probe.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_memcached.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_tier.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_routing.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_batches.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_presence.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_workers.cpp
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_check.cpp)
  # PUBLIC: what links these objects (the shared library, the INTERNAL suites) links the stores'
  # libraries.
  target_link_libraries(kvoffload_remote PUBLIC PkgConfig::KVO_HIREDIS PkgConfig::KVO_MEMCACHED
                                                PkgConfig::KVO_XXHASH OpenSSL::SSL OpenSSL::Crypto)
  # A precompiled header of its own: the stores' pkg-config flags (-D_FILE_OFFSET_BITS=64 from
  # libmemcached.pc) make kvoffload_objects' unusable here.
  kvoffload_precompile(kvoffload_remote <spdlog/spdlog.h> <functional> <memory> <span> <string>
                       <vector>)
  set(KVOFFLOAD_REMOTE_OBJECTS kvoffload_remote)
else()
  message(STATUS "kvoffload: remote tier off (KVOFFLOAD_REMOTE_TIER=OFF): remote URLs are refused")
  set(KVOFFLOAD_REMOTE_OBJECTS kvoffload_remote_absent)
endif()
if(NOT KVOFFLOAD_REMOTE_TIER OR KVOFFLOAD_BUILD_TESTS)
  kvoffload_remote_objects(kvoffload_remote_absent
    ${CMAKE_CURRENT_LIST_DIR}/remote/remote_tier_absent.cpp)
  if(KVOFFLOAD_PCH)  # the same flags as kvoffload_objects
    target_precompile_headers(kvoffload_remote_absent REUSE_FROM kvoffload_objects)
  endif()
endif()
