#pragma once
// The shared owner of a Region on the Python side (see Note [Views keep the region mapped] in
// region.cpp).
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

namespace kvoffload::python {

struct RegionHolder {
  explicit RegionHolder(Region r) : region(std::move(r)) {}
  Region region;
  std::atomic<long> live_views{0};

  bool close() {
    if (const long n = live_views.load(); n > 0 && region.is_open()) {
      throw Error(ErrorCode::kState,
                  "cannot close region " + region.path().string() + ": " + std::to_string(n) +
                      " HostBuffer view(s) of it are still alive (drop them, and the arrays "
                      "made from them, first)");
    }
    return region.close();
  }
};

// Bytes of a region, kept mapped by the shared reference (counts itself in live_views).
class HostBuffer {
 public:
  HostBuffer(std::shared_ptr<RegionHolder> owner, void* data, std::size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {
    ++owner_->live_views;
  }
  HostBuffer(const HostBuffer& other)
      : owner_(other.owner_), data_(other.data_), size_(other.size_) {
    ++owner_->live_views;
  }
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { --owner_->live_views; }

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  std::shared_ptr<RegionHolder> owner_;
  void* data_;
  std::size_t size_;
};

}  // namespace kvoffload::python
