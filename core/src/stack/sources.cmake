# The composition root: OffloadStack/OffloadWorker put region, transfer engine, manager and tiers
# together for an engine, so no component below has to include another's engine.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/offload_stack.cpp
  ${CMAKE_CURRENT_LIST_DIR}/offload_worker.cpp)
