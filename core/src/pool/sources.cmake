# The node pool: one KV chunk pool and index per node, shared by every engine that attaches, with
# no server (docs/DESIGN.md §6.6).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/proc_stat.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool_lock.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool_repair.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pool_arc.cpp
  ${CMAKE_CURRENT_LIST_DIR}/node_pool.cpp)
