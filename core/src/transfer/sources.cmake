# Transfer component: device-runtime interface + factory, host backend, fault-injecting decorator,
target_sources(kvoffload PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/device_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_runtime.cpp
  )
