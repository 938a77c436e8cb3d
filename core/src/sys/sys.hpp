#pragma once
// Thin owners over the Syscalls table: every descriptor and mapping the region layer opens is held
// by one of these from the moment it exists, so an exception at any later step releases it.

#include <cerrno>
#include <cstddef>
#include <utility>

#include "sys/syscalls.hpp"
#include "util/retry_eintr.hpp"  // retry_eintr, shared with the file tier

namespace kvoffload::detail {

// An owned file descriptor closed through the table that opened it. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  UniqueFd(const Syscalls& sys, int fd) noexcept : sys_(&sys), fd_(fd) {}
  UniqueFd(std::nullptr_t) = delete;
  UniqueFd(UniqueFd&& o) noexcept : sys_(o.sys_), fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      (void)reset();
      sys_ = o.sys_;
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { (void)reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }

  // Closes now; returns 0 or the errno of close (the descriptor is gone either way on Linux, so
  // close is never retried).
  int reset() noexcept {
    if (fd_ < 0) return 0;
    const int fd = std::exchange(fd_, -1);
    return sys_->close(sys_->context, fd) == 0 ? 0 : errno;
  }

 private:
  const Syscalls* sys_ = nullptr;
  int fd_ = -1;
};

// An owned mapping unmapped through the table that mapped it. Move-only.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const Syscalls& sys, void* addr, std::size_t len) noexcept
      : sys_(&sys), addr_(addr), len_(len) {}
  Mapping(Mapping&& o) noexcept
      : sys_(o.sys_), addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      (void)reset();
      sys_ = o.sys_;
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { (void)reset(); }

  [[nodiscard]] std::byte* data() const noexcept { return static_cast<std::byte*>(addr_); }
  [[nodiscard]] std::size_t size() const noexcept { return len_; }
  [[nodiscard]] bool valid() const noexcept { return addr_ != nullptr; }

  // Unmaps now; returns 0 or the errno of munmap.
  int reset() noexcept {
    if (addr_ == nullptr) return 0;
    void* addr = std::exchange(addr_, nullptr);
    const std::size_t len = std::exchange(len_, 0);
    return sys_->munmap(sys_->context, addr, len) == 0 ? 0 : errno;
  }

 private:
  const Syscalls* sys_ = nullptr;
  void* addr_ = nullptr;
  std::size_t len_ = 0;
};

}  // namespace kvoffload::detail
