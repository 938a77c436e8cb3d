# Live statistics read from outside a running engine: the lock-free readers of the page a region
# carries (its layout and writers' side: Note [Live stats] in live/live_page.hpp).
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/live_read.cpp)
