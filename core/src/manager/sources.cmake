# Manager, block keys and eviction policies (DESIGN.md §4).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/block_key.cpp
  ${CMAKE_CURRENT_LIST_DIR}/policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lru_policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/arc_policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vllm_policies.cpp
  ${CMAKE_CURRENT_LIST_DIR}/manager.cpp)
