# The C API (core/include/kvoffload/kvoffload.h): thin extern "C" wrappers over the C++ API.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/capi_error.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capi_region.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capi_manager.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capi_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capi_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capi_transfer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capi_remote.cpp
  ${CMAKE_CURRENT_LIST_DIR}/capi_worker.cpp)
