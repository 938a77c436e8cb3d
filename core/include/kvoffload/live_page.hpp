#pragma once
// Where the writers of live statistics publish (Note [Live stats] in core/src/live/live_page.hpp,
// docs/DESIGN.md §10.3): a page other processes can map, whose owner tells each writer before the
// page goes away. A region is one (Region implements it); Manager::publish_live_stats and
// TieredStore::publish_live_stats take the sink, so neither knows what owns the page.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include <kvoffload/export.h>

namespace kvoffload {

class KVOFFLOAD_API LivePageSink {
 public:
  virtual ~LivePageSink();

  // The page's bytes (their layout is the library's own: Note [Live stats]); empty once the page
  // is gone.
  [[nodiscard]] virtual std::span<std::byte> live_area() const noexcept = 0;
  // Chunks of the pool the page describes (a writer of another pool's statistics is refused).
  [[nodiscard]] virtual std::uint64_t live_num_chunks() const noexcept = 0;
  // What error messages call the page's owner ("region /dev/shm/kvoffload_e.region").
  [[nodiscard]] virtual std::string live_name() const = 0;
  // Runs `hook` before the page goes away (the writer stops publishing there), in reverse order
  // of registration. Throws kState once the page is gone.
  virtual void on_live_close(std::function<void()> hook) = 0;

 protected:
  LivePageSink() = default;
  LivePageSink(const LivePageSink&) = default;
  LivePageSink(LivePageSink&&) = default;
  LivePageSink& operator=(const LivePageSink&) = default;
  LivePageSink& operator=(LivePageSink&&) = default;
};

}  // namespace kvoffload
