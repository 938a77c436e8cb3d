# Which Python the module is built for. The module must be importable, and its tests runnable, by
# the interpreter it is built against, so that interpreter must have numpy (the bindings hand out
# numpy arrays); pybind11 comes from that interpreter's pip package when it has one
# (`python -m pybind11 --cmakedir`), else from the system's CMake package (Debian: pybind11-dev).
#
# The first python3 on PATH is often a pyenv/venv/conda interpreter without numpy, while
# /usr/bin/python3 has the distribution's packages; a plain `cmake -S . -B build` must not pick
# the former just because it comes first.
#
# KVOFFLOAD_PYTHON_NEEDS_NUMPY=OFF (what `pip install .` passes, python/build_backend/) drops the
# numpy requirement: the module itself builds and imports without numpy; only the tests need it.

# kvoffload_pick_python(<out-exe> <out-report> [<pybind11-dir-var>] CANDIDATES exe...)
# Sets <out-exe> to the first candidate that runs and imports numpy ("" when none does) and
# <out-report> to one line per candidate saying why it was taken or skipped. <pybind11-dir-var>
# gets that interpreter's pybind11 CMake directory, or "" when it has no pybind11 package.
# Works in script mode too (tests/cmake/pick_python_test.cmake).
function(kvoffload_pick_python out_exe out_report out_pybind11_dir)
  cmake_parse_arguments(ARG "" "" "CANDIDATES" ${ARGN})
  set(report "")
  set(seen "")
  foreach(candidate IN LISTS ARG_CANDIDATES)
    if(candidate STREQUAL "" OR candidate IN_LIST seen)
      continue()
    endif()
    list(APPEND seen "${candidate}")
    if(NOT DEFINED KVOFFLOAD_PYTHON_NEEDS_NUMPY OR KVOFFLOAD_PYTHON_NEEDS_NUMPY)
      set(_kvo_what "import numpy")
      set(_kvo_probe "import numpy, sys; print(sys.version.split()[0] + ' numpy ' + numpy.__version__)")
    else()
      set(_kvo_what "run")
      set(_kvo_probe "import sys; print(sys.version.split()[0])")
    endif()
    execute_process(COMMAND "${candidate}" -c "${_kvo_probe}"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      string(REGEX REPLACE ".*\n" "" err "${err}")  # the last line: "ModuleNotFoundError: ..."
      if(err STREQUAL "")
        set(err "exit status ${rc}")
      endif()
      string(APPEND report "  ${candidate}: skipped, cannot ${_kvo_what} (${err})\n")
      continue()
    endif()
    execute_process(COMMAND "${candidate}" -m pybind11 --cmakedir
                    RESULT_VARIABLE rc OUTPUT_VARIABLE pybind11_dir ERROR_QUIET
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT rc EQUAL 0)
      set(pybind11_dir "")
    endif()
    string(APPEND report "  ${candidate}: taken (Python ${out})\n")
    set(${out_exe} "${candidate}" PARENT_SCOPE)
    set(${out_report} "${report}" PARENT_SCOPE)
    set(${out_pybind11_dir} "${pybind11_dir}" PARENT_SCOPE)
    return()
  endforeach()
  set(${out_exe} "" PARENT_SCOPE)
  set(${out_report} "${report}" PARENT_SCOPE)
  set(${out_pybind11_dir} "" PARENT_SCOPE)
endfunction()

# Sets Python_EXECUTABLE (cache) for find_package(Python): the one given with -DPython_EXECUTABLE
# (checked: it must import numpy), else the first usable of: python3 on PATH, /usr/bin/python3.
# Fails the configure with the reasons when none is usable.
function(kvoffload_select_python)
  set(hint "Install numpy for it (Debian: python3-numpy, see tools/setup/install-deps.sh), pass "
           "-DPython_EXECUTABLE=/path/to/python3 with numpy, or configure with "
           "-DKVOFFLOAD_BUILD_PYTHON=OFF")
  if(DEFINED Python_EXECUTABLE AND NOT Python_EXECUTABLE STREQUAL "")
    kvoffload_pick_python(exe report pybind11_dir CANDIDATES "${Python_EXECUTABLE}")
    if(exe STREQUAL "")
      message(FATAL_ERROR "kvoffload: Python_EXECUTABLE=${Python_EXECUTABLE} cannot build the Python "
                          "module:\n${report}" ${hint})
    endif()
  else()
    find_program(_kvo_path_python NAMES python3 NO_CACHE)
    kvoffload_pick_python(exe report pybind11_dir CANDIDATES "${_kvo_path_python}" /usr/bin/python3)
    if(exe STREQUAL "")
      message(FATAL_ERROR "kvoffload: no python3 with numpy was found for the Python module:\n"
                          "${report}" ${hint})
    endif()
    set(Python_EXECUTABLE "${exe}" CACHE FILEPATH "Python interpreter the module is built for")
  endif()
  message(STATUS "kvoffload: Python module for ${exe}\n${report}")
  if(NOT pybind11_dir STREQUAL "" AND NOT DEFINED pybind11_DIR)
    set(pybind11_DIR "${pybind11_dir}" CACHE PATH "pybind11's CMake package (from ${exe} -m pybind11)")
  endif()
endfunction()
