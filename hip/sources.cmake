target_sources(kvoffload_hip_backend PRIVATE ${CMAKE_CURRENT_LIST_DIR}/src/hip_probe.cpp)
