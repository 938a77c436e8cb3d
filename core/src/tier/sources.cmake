# Secondary tiers (file tier) and the tiered store over the manager.
target_sources(kvoffload PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/crc32c.cpp
  ${CMAKE_CURRENT_LIST_DIR}/io_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tier.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_record.cpp
  ${CMAKE_CURRENT_LIST_DIR}/direct_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_tier_recovery.cpp
  ${CMAKE_CURRENT_LIST_DIR}/file_tier.cpp)
target_sources(kvoffload PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/tiered_store.cpp
  ${CMAKE_CURRENT_LIST_DIR}/offload_stack.cpp)
