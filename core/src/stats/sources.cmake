# Live statistics of a region (Note [Live stats] in live_page.hpp): the page layout its writers
# (manager, tiered store, transfer engine, bring-up) share, and the lock-free readers.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/live_page.cpp
  ${CMAKE_CURRENT_LIST_DIR}/live_read.cpp)
