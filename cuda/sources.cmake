target_sources(kvoffload_cuda_backend PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_batch_memcpy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_check.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_device_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/src/cuda_factory.cpp)
