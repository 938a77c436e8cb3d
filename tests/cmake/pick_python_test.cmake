# cmake -P tests/cmake/pick_python_test.cmake -DSOURCE_DIR=<repo> -DWORK_DIR=<scratch dir>
# kvoffload_pick_python against fake interpreters: one that cannot import numpy (like a bare
# pyenv python3 first on PATH) and one that can (like Debian's /usr/bin/python3).
cmake_minimum_required(VERSION 3.25)
include(${SOURCE_DIR}/cmake/KvoffloadPython.cmake)

set(dir ${WORK_DIR}/pick_python)
file(REMOVE_RECURSE ${dir})
file(MAKE_DIRECTORY ${dir})
# A bare interpreter: every `-c` fails as a missing numpy does.
file(WRITE ${dir}/bare "#!/bin/sh\necho \"Traceback (most recent call last):\" >&2\necho \"ModuleNotFoundError: No module named 'numpy'\" >&2\nexit 1\n")
# A complete one: numpy imports; it also has a pybind11 pip package.
file(WRITE ${dir}/full "#!/bin/sh\nif [ \"$1\" = -m ]; then echo /opt/pybind11/share/cmake/pybind11; else echo '3.11.2 numpy 1.24.2'; fi\n")
# numpy but no pybind11 package (pybind11 then comes from the system's CMake package).
file(WRITE ${dir}/numpy_only "#!/bin/sh\nif [ \"$1\" = -m ]; then exit 1; fi\necho '3.11.2 numpy 1.24.2'\n")
file(CHMOD ${dir}/bare ${dir}/full ${dir}/numpy_only PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)

function(expect what actual expected)
  if(NOT "${actual}" STREQUAL "${expected}")
    message(FATAL_ERROR "${what}: got '${actual}', expected '${expected}'")
  endif()
endfunction()

# The first candidate lacks numpy: the second is taken, and the report says why the first was not.
kvoffload_pick_python(exe report pybind11_dir CANDIDATES ${dir}/bare ${dir}/full)
expect("bare then full" "${exe}" "${dir}/full")
expect("pybind11 dir of full" "${pybind11_dir}" "/opt/pybind11/share/cmake/pybind11")
string(FIND "${report}" "${dir}/bare: skipped, cannot import numpy (ModuleNotFoundError: No module named 'numpy')" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the report does not say why bare was skipped:\n${report}")
endif()

# The first usable candidate wins, even when a later one is usable too.
kvoffload_pick_python(exe report pybind11_dir CANDIDATES ${dir}/numpy_only ${dir}/full)
expect("numpy_only then full" "${exe}" "${dir}/numpy_only")
expect("pybind11 dir of numpy_only" "${pybind11_dir}" "")

# None usable: empty, with the reason for each (the caller fails the configure with it).
kvoffload_pick_python(exe report pybind11_dir CANDIDATES ${dir}/bare ${dir}/missing)
expect("none usable" "${exe}" "")
string(FIND "${report}" "${dir}/missing: skipped" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the report does not mention the missing interpreter:\n${report}")
endif()
message(STATUS "pick_python_test: OK")
