target_sources(kvoffload_cuda_backend PRIVATE ${CMAKE_CURRENT_LIST_DIR}/src/cuda_probe.cpp)
