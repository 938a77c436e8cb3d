# Secondary tiers (file tier) and the tiered store over the manager.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/crc32c.cpp
  ${CMAKE_CURRENT_LIST_DIR}/io_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tier.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_tier.cpp)
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tiered_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/offload_stack.cpp)
