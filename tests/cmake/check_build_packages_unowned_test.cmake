# cmake -P tests/cmake/check_build_packages_unowned_test.cmake -DSOURCE_DIR=<repo>
#   -DWORK_DIR=<scratch dir> -DPYTHON=<python3>
# tools/setup/check-build-packages.py reports a build input that no Debian package installed (a
# hand-made install a fresh machine lacks) and fails, naming the file: a build directory whose only
# record is a depfile naming a header in /var/tmp (outside the source tree, the build directories
# and /tmp, where such files are allowed).
cmake_minimum_required(VERSION 3.25)

set(build ${WORK_DIR}/check_build_packages_unowned)
file(REMOVE_RECURSE ${build})
file(MAKE_DIRECTORY ${build})
string(RANDOM LENGTH 12 tag)
set(header /var/tmp/kvoffload-unowned-${tag}.h)
file(WRITE ${header} "/* written by check_build_packages_unowned_test.cmake */\n")
file(WRITE ${build}/object.o.d "object.o: ${header}\n")
execute_process(COMMAND ${PYTHON} ${SOURCE_DIR}/tools/setup/check-build-packages.py ${build}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
file(REMOVE ${header})
file(REMOVE_RECURSE ${build})

if(NOT rc EQUAL 1)
  message(FATAL_ERROR "exit ${rc}, expected 1 (a file of no package):\n${out}${err}")
endif()
set(want "check-build-packages: ${build} used ${header} (headers (object.o.d)), which no Debian package installed: a hand-made install a fresh machine does not have")
string(FIND "${out}" "${want}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the report does not name the file:\nwanted: ${want}\ngot:\n${out}${err}")
endif()
string(FIND "${out}" "FAILED" failed)
if(failed EQUAL -1)
  message(FATAL_ERROR "the summary does not say FAILED:\n${out}")
endif()
