# cmake -P tests/cmake/remote_tier_option_test.cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch dir>
#   [-DGENERATOR=Ninja]
# KVOFFLOAD_REMOTE_TIER on a machine whose pkg-config finds nothing (as on a GPU host without the
# remote tier's packages): OFF configures the library and the program (exporter off too, as
# tools/gpu-smoke.sh --minimal does) without reading hiredis, libmemcached, libxxhash or OpenSSL,
# and compiles remote_tier_absent.cpp in place of the store clients; ON fails the configure
# naming each missing package and the option that builds without them. Configure only: that such
# a library links without the stores' libraries and refuses remote URLs is remote_absent_tests'.
cmake_minimum_required(VERSION 3.25)
if(NOT GENERATOR)
  set(GENERATOR Ninja)
endif()
set(dir ${WORK_DIR}/remote_tier_option)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir}/empty-pkgconfig)
# An empty search path: pkg-config finds no .pc file at all (PKG_CONFIG_PATH is searched first).
set(ENV{PKG_CONFIG_LIBDIR} ${dir}/empty-pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
set(common -G ${GENERATOR} -DKVOFFLOAD_EXPORTER=OFF -DKVOFFLOAD_BUILD_TESTS=OFF
           -DKVOFFLOAD_BUILD_BENCH=OFF -DKVOFFLOAD_BUILD_PYTHON=OFF -DKVOFFLOAD_CUDA=OFF
           -DKVOFFLOAD_HIP=OFF -DKVOFFLOAD_PCH=OFF)

function(configure name rc_var out_var)
  execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${dir}/${name} ${common} ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  # CMake wraps and indents a message's lines: compare with runs of white space as one space.
  string(REGEX REPLACE "[ \t\n]+" " " text "${out}${err}")
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

function(expect_in what haystack needle)
  string(FIND "${haystack}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what}: '${needle}' not found in:\n${haystack}")
  endif()
endfunction()

# OFF: configures, and the build it generates reads no store package.
configure(off rc out -DKVOFFLOAD_REMOTE_TIER=OFF)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "KVOFFLOAD_REMOTE_TIER=OFF did not configure without pkg-config's packages "
                      "(exit ${rc}):\n${out}")
endif()
expect_in("OFF configure" "${out}" "remote tier off (KVOFFLOAD_REMOTE_TIER=OFF)")
if(GENERATOR STREQUAL "Ninja")
  file(READ ${dir}/off/build.ninja build)
else()
  file(GLOB_RECURSE makefiles ${dir}/off/*.make)
  set(build "")
  foreach(f ${makefiles})
    file(READ ${f} text)
    string(APPEND build "${text}")
  endforeach()
endif()
expect_in("OFF build" "${build}" "remote_tier_absent.cpp")
foreach(word hiredis memcached xxhash -lssl libssl remote_redis remote_tier.cpp)
  string(FIND "${build}" "${word}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "KVOFFLOAD_REMOTE_TIER=OFF still builds or links '${word}'")
  endif()
endforeach()
file(READ ${dir}/off/CMakeCache.txt cache)
expect_in("OFF cache" "${cache}" "KVOFFLOAD_REMOTE_TIER:BOOL=OFF")

# ON (the default) without the packages: a configure error naming them and the way out.
configure(on rc out)
if(rc EQUAL 0)
  message(FATAL_ERROR "KVOFFLOAD_REMOTE_TIER=ON configured although pkg-config finds nothing")
endif()
expect_in("ON configure" "${out}" "hiredis (libhiredis-dev)")
expect_in("ON configure" "${out}" "libmemcached (libmemcached-dev)")
expect_in("ON configure" "${out}" "libxxhash (libxxhash-dev)")
expect_in("ON configure" "${out}" "-DKVOFFLOAD_REMOTE_TIER=OFF")
file(REMOVE_RECURSE ${dir})
message(STATUS "remote_tier_option_test: OK")
