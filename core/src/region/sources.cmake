# The shared host region and the platform layer under it. It lays out the live statistics page
# (live/) in its file, reads it back from outside a running engine (live_read.cpp, the readers of
# kvoffload/live_stats.hpp: they read the region's header and list the shm dir as the region
# does), and makes its system calls through the seam (sys/).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/platform.cpp
  ${CMAKE_CURRENT_LIST_DIR}/geometry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/header.cpp
  ${CMAKE_CURRENT_LIST_DIR}/proc_locks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/owners.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ownership.cpp
  ${CMAKE_CURRENT_LIST_DIR}/populate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checks.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attach.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bringup.cpp
  ${CMAKE_CURRENT_LIST_DIR}/region.cpp
  ${CMAKE_CURRENT_LIST_DIR}/listing.cpp
  ${CMAKE_CURRENT_LIST_DIR}/live_read.cpp)
