# Transfer engine: KV layout, the region's rank slots, the planner and the engine itself, built on
# the device runtime (src/runtime).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/kv_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/region_slots.cpp
  ${CMAKE_CURRENT_LIST_DIR}/planner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/transfer_engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/calibrate.cpp)
