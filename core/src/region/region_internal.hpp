#pragma once
// Pieces of the region shared by its files: region.cpp (the Region's lifetime), checks.cpp (what
// is refused), attach.cpp (the create-join protocol), bringup.cpp (progressive bring-up) and
// listing.cpp (list/clean).

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <kvoffload/region.hpp>

#include "live/live_page.hpp"
#include "region/header.hpp"
#include "sys/sys.hpp"
#include "sys/syscalls.hpp"

namespace kvoffload::detail {

inline constexpr const char* kRegionPrefix = "kvoffload_";
inline constexpr const char* kRegionSuffix = ".region";

// ---- names and files (checks.cpp) ----

// Throws kInvalidArgument unless `id` is 1..128 of [A-Za-z0-9._-] and not "." or "..".
void validate_engine_id(const std::string& id);

// "kvoffload_<id>.region" -> "<id>", or "" when `name` is not a region file name.
std::string engine_id_from_file_name(const std::string& name);

// Refuses a file this user must not join or remove: not a regular file, another owner, or a mode
// wider than 0600. Throws Error(kPermission) naming the path, the value found and what is allowed.
void check_owner_and_mode(const struct stat& st, const std::string& path);

// Whether `name` in `dirfd` is still the file (dev, ino) we hold. ENOENT counts as "no".
// Throws Error(kSystem) for other fstatat failures.
bool path_names_inode(const Syscalls& sys, int dirfd, const std::string& name,
                      const struct stat& held);

// Opens a directory for *at() calls; refuses a missing or non-directory path with
// kInvalidArgument.
int open_shm_dir(const Syscalls& sys, const std::string& dir);

// Everything the caller gave create_or_join, checked before any file is touched (the engine id,
// populate_threads, bringup_piece_bytes, the bring-up mode, join_timeout). Throws
// kInvalidArgument naming the value.
void validate_options(const RegionOptions& options);

// ---- the create-join protocol (attach.cpp, Note [Region lifetime]) ----

// Everything one create_or_join call works with.
struct Attempt {
  const Syscalls& sys;
  const RegionOptions& options;
  const RegionGeometry& geometry;
  std::string dir;
  std::string name;
  std::string path;
  int dirfd = -1;
  std::uint64_t file_bytes = 0;  // header page + data
  std::chrono::steady_clock::time_point started;
  std::chrono::steady_clock::time_point deadline;
  std::string last_observed = "absent";
};

// What a successful attempt holds: the descriptor (with LOCK_SH), its stat, the mapping, the role.
struct Attached {
  UniqueFd fd;
  struct stat st {};
  Mapping mapping;  // set by the creator; joiners map after validation
  RegionRole role = RegionRole::kJoiner;
};

// Creates or joins until attached; throws kTimeout past the deadline and any refusal on the way.
Attached attach(Attempt& a);

// Throws kCapacity, naming the sizes and the fixes, when the region would not fit (checks.cpp).
void check_capacity(const Attempt& a);

// Validates a header against our geometry; throws kMismatch naming both values (checks.cpp).
void check_header(const Attempt& a, const RegionHeader& h);

// ---- leaving (region.cpp) ----

// Unlinks `name` only when it still names the inode we hold; returns errno of the failed step.
int unlink_if_ours(const Syscalls& sys, int dirfd, const std::string& name,
                   const struct stat& st) noexcept;

// "Am I the last one?", asked on the way out only (Note [Region lifetime]): unlinks the file when
// no other process holds the liveness lock. Returns "" or what failed.
std::string unlink_if_last(const Syscalls& sys, int fd, int dirfd, const std::string& name,
                           const struct stat& st) noexcept;

// ---- the readiness table (Note [Progressive bring-up] in bringup.cpp) ----

inline std::atomic_ref<std::uint32_t> table_state(RankReadiness& e) {
  return std::atomic_ref(e.state);
}
inline std::atomic_ref<std::uint32_t> table_errno(RankReadiness& e) {
  return std::atomic_ref(e.sys_errno);
}
inline std::atomic_ref<std::uint64_t> table_ready(RankReadiness& e) {
  return std::atomic_ref(e.ready_chunks);
}

}  // namespace kvoffload::detail

namespace kvoffload {

struct Region::Impl {
  ~Impl() {
    // A Region whose create_or_join threw after starting nothing has no thread; a moved-from or
    // closed one has joined it. This is the last line of defence, never the normal path.
    if (bringup_thread.joinable()) {
      stop.store(true);
      bringup_thread.join();
    }
  }
  const Syscalls* sys = nullptr;
  std::string engine_id;
  std::filesystem::path path;
  std::string name;
  RegionGeometry geometry;
  RegionRole role = RegionRole::kJoiner;
  std::optional<std::uint32_t> rank;
  PopulateReport populate;
  detail::UniqueFd dir;
  detail::UniqueFd fd;
  detail::Mapping mapping;
  std::byte* data = nullptr;
  struct stat st {};
  std::vector<std::function<void()>> hooks;
  bool open = false;

  // Bring-up (Note [Progressive bring-up]).
  std::string shm_dir;
  bool populate_pages = true;
  unsigned populate_threads = 1;
  std::uint64_t piece_rows = 1;        // of the largest piece
  std::uint64_t first_piece_rows = 1;  // Note [Growing pieces]
  std::function<void(std::span<std::byte>, std::uint64_t, std::uint64_t)> on_piece_ready;
  detail::RankReadiness* table = nullptr;  // in the mapping, one entry per rank
  detail::LivePage* live = nullptr;        // in the mapping (Note [Live stats])
  std::chrono::steady_clock::time_point started;
  std::thread bringup_thread;
  std::atomic<bool> stop{false};
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  BringupStatus bringup;  // under mu
};

}  // namespace kvoffload
