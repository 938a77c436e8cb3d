# Block keys: the identity every component (manager, tiers, transfer jobs, the C and Python APIs)
# uses for a KV block, and the one hash over them.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/block_key.cpp)
