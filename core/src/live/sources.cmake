# The live statistics page (Note [Live stats] in live/live_page.hpp): its layout and the sequence
# lock its writers use. The region lays it out in its file; the manager, the tiered store and the
# transfer engine write their blocks; stats/ reads it from outside.
target_sources(kvoffload_objects PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/live_page.cpp)
