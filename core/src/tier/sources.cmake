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

# The distributed tier: Redis (standalone, Cluster) through hiredis, memcached through
# libmemcached, value checksums with libxxhash, TLS with OpenSSL (Debian: libhiredis-dev
# libmemcached-dev libxxhash-dev libssl-dev).
find_package(PkgConfig REQUIRED)
find_package(OpenSSL REQUIRED)
pkg_check_modules(KVO_HIREDIS REQUIRED IMPORTED_TARGET hiredis)
pkg_check_modules(KVO_MEMCACHED REQUIRED IMPORTED_TARGET libmemcached)
pkg_check_modules(KVO_XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# xxHash's run-time dispatch (xxh_x86dispatch: the AVX2 / AVX-512 kernels where the CPU has them)
# computes the same XXH3 values 2-3x faster than the SSE2 entry points; Debian's libxxhash builds
# it in. Used for the values' payloads when this libxxhash has it.
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
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/remote/remote_url.cpp
  ${CMAKE_CURRENT_LIST_DIR}/remote/remote_config.cpp
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
target_link_libraries(kvoffload_objects PUBLIC PkgConfig::KVO_HIREDIS PkgConfig::KVO_MEMCACHED
                                               PkgConfig::KVO_XXHASH OpenSSL::SSL OpenSSL::Crypto)
