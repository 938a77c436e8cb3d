target_sources(kvoffload_hip_backend PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/src/hip_batch_memcpy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/hip_check.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/hip_device_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/hip_factory.cpp)
