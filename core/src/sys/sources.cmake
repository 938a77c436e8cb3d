# The system-call seam (docs/DESIGN.md §3.8): the table (syscalls.hpp, internal: an engine never sees it), and
# the owners of the descriptors and mappings opened through it (sys.hpp). The region and the file
# tier make their system calls through it, so one fault injector drives both (§11.2).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/syscalls.cpp)
