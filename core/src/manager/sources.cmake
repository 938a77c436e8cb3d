# Manager and its eviction policies (LRU, ARC, and vLLM's semantics of both).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lru_policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arc_policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vllm_policies.cpp
  ${CMAKE_CURRENT_LIST_DIR}/slot_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/threshold_tracker.cpp
  ${CMAKE_CURRENT_LIST_DIR}/manager.cpp)
