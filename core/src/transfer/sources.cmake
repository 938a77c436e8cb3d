# Transfer component: device-runtime interface + factory, host backend, fault-injecting decorator,
# KV layout, planner and the transfer engine.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/device_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/host_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fault_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kv_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/region_slots.cpp
  ${CMAKE_CURRENT_LIST_DIR}/planner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transfer_engine.cpp)
