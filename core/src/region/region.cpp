// The Region's lifetime: create_or_join (checks, the create-join protocol, then the bring-up),
// the accessors of an open region, and close (bring-up thread, hooks, unmap, role release, the
// last-out unlink; the Teardown paragraph of Note [Region lifetime] in attach.cpp).

#include <sys/file.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/platform.hpp>
#include <kvoffload/region.hpp>

#include "live/live_page.hpp"
#include "region/header.hpp"
#include "region/owners.hpp"
#include "region/populate.hpp"
#include "region/region_internal.hpp"
#include "sys/sys.hpp"
#include "sys/syscalls.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace kvoffload {

namespace detail {

// Unlinks `name` only when it still names the inode we hold; returns errno of the failed step.
int unlink_if_ours(const Syscalls& sys, int dirfd, const std::string& name,
                   const struct stat& st) noexcept {
  try {
    if (!detail::path_names_inode(sys, dirfd, name, st)) return 0;
  } catch (const Error& e) {
    return e.sys_errno();
  }
  if (sys.unlinkat(sys.context, dirfd, name.c_str(), 0) != 0 && errno != ENOENT) return errno;
  return 0;
}

// "Am I the last one?", asked on the way out only (Note [Region lifetime] in attach.cpp): unlinks
// the file when no other process holds the liveness lock. Returns "" or what failed.
std::string unlink_if_last(const Syscalls& sys, int fd, int dirfd, const std::string& name,
                           const struct stat& st) noexcept {
  if (sys.flock(sys.context, fd, LOCK_EX | LOCK_NB) == 0) {
    if (const int err = unlink_if_ours(sys, dirfd, name, st)) return "unlink: " + errno_name(err);
  } else if (errno != EWOULDBLOCK) {
    return "flock: " + errno_name(errno) +
           " (the file stays; it is stale and `region clean` removes it)";
  }
  return {};
}

}  // namespace detail

using Clock = std::chrono::steady_clock;
using util::seconds_since;

Region Region::create_or_join(const RegionOptions& options) {
  const Syscalls& sys = options.syscalls != nullptr ? *options.syscalls : real_syscalls();
  // Everything the caller gave is checked before any file is touched.
  detail::validate_options(options);
  const RegionGeometry geometry = RegionGeometry::compute(options.layout, platform::page_size());
  if (options.rank) (void)geometry.copy_index(*options.rank);
  const std::filesystem::path shm_dir =
      options.shm_dir.empty() ? default_shm_dir() : options.shm_dir;
  const std::filesystem::path path = region_path(shm_dir, options.engine_id);

  detail::UniqueFd dir(sys, detail::open_shm_dir(sys, shm_dir.string()));
  detail::Attempt a{
      .sys = sys,
      .options = options,
      .geometry = geometry,
      .dir = shm_dir.string(),
      .name = path.filename().string(),
      .path = path.string(),
      .dirfd = dir.get(),
      .file_bytes = detail::data_offset_for(geometry.page_size(), geometry.world_size()) +
                    geometry.data_bytes(),
      .started = Clock::now(),
      .deadline = Clock::now() + options.join_timeout};

  detail::Attached attached = detail::attach(a);

  auto impl = std::make_unique<Impl>();
  impl->sys = &sys;
  impl->engine_id = options.engine_id;
  impl->path = path;
  impl->name = a.name;
  impl->geometry = geometry;
  impl->role = attached.role;
  impl->rank = options.rank;
  impl->dir = std::move(dir);
  impl->fd = std::move(attached.fd);
  impl->mapping = std::move(attached.mapping);
  impl->data =
      impl->mapping.data() + detail::data_offset_for(geometry.page_size(), geometry.world_size());
  impl->table =
      reinterpret_cast<detail::RankReadiness*>(impl->mapping.data() + detail::kReadinessOffset);
  impl->live = reinterpret_cast<detail::LivePage*>(
      impl->mapping.data() + detail::stats_offset_for(geometry.page_size(), geometry.world_size()));
  impl->st = attached.st;
  impl->open = true;
  impl->shm_dir = shm_dir.string();
  impl->populate_pages = options.populate;
  impl->populate_threads = options.populate_threads;
  impl->piece_rows =
      std::max<std::uint64_t>(1, options.bringup_piece_bytes / geometry.row_stride());
  impl->first_piece_rows = std::min(
      impl->piece_rows,
      std::max<std::uint64_t>(1, options.bringup_first_piece_bytes / geometry.row_stride()));
  // The first hook, so it runs last, just before munmap (RegionOptions::on_teardown).
  if (options.on_teardown) impl->hooks.push_back(options.on_teardown);
  impl->on_piece_ready = options.on_piece_ready;
  impl->started = a.started;
  impl->bringup.num_chunks = geometry.num_chunks();
  Region region(std::move(impl));
  log().info("region {}: {} ({} bytes, {} chunks x {} row stride)", a.path,
             region.role() == RegionRole::kCreator ? "created" : "joined", a.file_bytes,
             geometry.num_chunks(), geometry.row_stride());

  // A failure here goes through the normal teardown (other processes may be attached already),
  // and the caller sees the populate (or allocation) error.
  Impl& s = *region.impl_;
  if (options.rank) {
    if (options.bringup == BringupMode::kBlocking) {
      run_bringup(s);
    } else {
      s.bringup.state = BringupState::kRunning;
      s.bringup_thread = std::thread([&s] {
        try {
          run_bringup(s);
        } catch (...) {
          // Recorded in the status and the table by run_bringup (Note [Progressive bring-up] in
          // bringup.cpp).
        }
      });
    }
    return region;
  }
  // Unranked: everything in blocking mode, nothing in background mode.
  if (options.bringup == BringupMode::kBlocking) {
    const detail::PopulatePlan plan(geometry, region.data(), std::nullopt);
    const detail::BackingFile file{
        .fd = s.fd.get(), .file_base = s.mapping.data(), .dirfd = s.dir.get(), .dir = s.shm_dir};
    if (options.populate) {
      s.populate = detail::populate(sys, plan, geometry.page_size(), options.populate_threads,
                                    "region " + a.path, file);
    } else {
      // Not pre-faulted, but allocated: a later first touch must never meet a full tmpfs.
      detail::allocate(sys, plan, file, "region " + a.path);
    }
    s.bringup.ready_chunks = geometry.num_chunks();
  }
  s.bringup.state = BringupState::kReady;
  s.bringup.seconds = seconds_since(a.started);
  return region;
}

Region::Region(std::unique_ptr<Impl> state) : impl_(std::move(state)) {}
Region::Region(Region&& other) noexcept = default;
Region& Region::operator=(Region&& other) noexcept {
  if (this != &other) {
    close();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
Region::~Region() {
  close();
}

const RegionGeometry& Region::geometry() const noexcept {
  return impl_->geometry;
}
RegionRole Region::role() const noexcept {
  return impl_->role;
}
const std::filesystem::path& Region::path() const noexcept {
  return impl_->path;
}
const std::string& Region::engine_id() const noexcept {
  return impl_->engine_id;
}
std::optional<std::uint32_t> Region::rank() const noexcept {
  return impl_->rank;
}
PopulateReport Region::populate_report() const {
  const std::lock_guard lock(impl_->mu);
  return impl_->populate;
}

bool Region::is_open() const noexcept {
  return impl_ != nullptr && impl_->open;
}
std::byte* Region::data() const noexcept {
  return is_open() ? impl_->data : nullptr;
}

std::span<std::byte> Region::slot(std::uint64_t chunk, std::uint32_t rank) const {
  if (!is_open()) throw Error(ErrorCode::kState, "slot() on a closed region");
  return {impl_->data + impl_->geometry.slot_offset(chunk, rank), impl_->geometry.slot_bytes()};
}

std::span<std::byte> Region::slot(std::uint64_t chunk) const {
  if (!is_open()) throw Error(ErrorCode::kState, "slot() on a closed region");
  if (!impl_->rank) {
    throw Error(ErrorCode::kState, "slot(chunk) needs a rank; region " + impl_->path.string() +
                                       " was mapped unranked (use slot(chunk, rank))");
  }
  return slot(chunk, *impl_->rank);
}

std::span<std::byte> Region::row(std::uint64_t chunk) const {
  if (!is_open()) throw Error(ErrorCode::kState, "row() on a closed region");
  const RegionGeometry& g = impl_->geometry;
  if (chunk >= g.num_chunks()) {
    throw_invalid("chunk " + std::to_string(chunk) + " is out of range: the region has " +
                  std::to_string(g.num_chunks()) + " chunks, so chunk must be 0.." +
                  std::to_string(g.num_chunks() - 1));
  }
  return {impl_->data + chunk * g.row_stride(), static_cast<std::size_t>(g.row_stride())};
}

void Region::add_teardown_hook(std::function<void()> hook) {
  if (!is_open()) throw Error(ErrorCode::kState, "add_teardown_hook() on a closed region");
  impl_->hooks.push_back(std::move(hook));
}

std::span<std::byte> Region::live_area() const noexcept {
  if (!is_open()) return {};
  const RegionGeometry& g = impl_->geometry;
  return {reinterpret_cast<std::byte*>(impl_->live),
          static_cast<std::size_t>(detail::stats_bytes_for(g.page_size(), g.world_size()))};
}
std::uint64_t Region::live_num_chunks() const noexcept {
  return impl_ == nullptr ? 0 : impl_->geometry.num_chunks();
}
std::string Region::live_name() const {
  return impl_ == nullptr ? std::string("the region") : "region " + impl_->path.string();
}
void Region::on_live_close(std::function<void()> hook) {
  add_teardown_hook(std::move(hook));
}

bool Region::close() noexcept {
  if (!is_open()) return true;
  Impl& s = *impl_;
  // The bring-up thread first: it may be registering a piece, and the hooks below unregister.
  if (s.bringup_thread.joinable()) {
    s.stop.store(true);
    s.bringup_thread.join();
  }
  if (s.rank && s.table != nullptr) {
    // A detached rank serves nothing: its entry says so (Note [Progressive bring-up] in
    // bringup.cpp).
    detail::RankReadiness& entry = s.table[*s.rank];
    detail::table_ready(entry).store(0, std::memory_order_release);
    // A failure stays visible (with its errno) to the processes still attached.
    const auto failed = static_cast<std::uint32_t>(BringupState::kFailed);
    if (detail::table_state(entry).load(std::memory_order_acquire) != failed) {
      detail::table_state(entry).store(static_cast<std::uint32_t>(BringupState::kStopped),
                                       std::memory_order_release);
    }
  }
  s.open = false;
  const std::string path = s.path.string();
  bool ok = true;
  // Teardown keeps going: every step runs whatever the previous one did; the first error wins
  // the log line, the return value says something failed.
  auto failed = [&](std::string_view step, const std::string& why) {
    log().error("region {}: teardown step {} failed: {}", path, step, why);
    ok = false;
  };
  for (auto it = s.hooks.rbegin(); it != s.hooks.rend(); ++it) {
    try {
      (*it)();
    } catch (const std::exception& e) {
      failed("teardown hook", e.what());
    } catch (...) {
      failed("teardown hook", "unknown exception");
    }
  }
  s.hooks.clear();
  s.data = nullptr;
  s.live = nullptr;
  if (const int err = s.mapping.reset()) failed("munmap", errno_name(err));

  // Nothing of ours touches the slots any more: the next holder may take the role (Note [Owners]).
  const Syscalls& sys = *s.sys;
  const detail::Role role{.world_size = s.geometry.world_size(), .rank = s.rank};
  if (const int err = detail::release_role(sys, s.fd.get(), role)) {
    failed("release of " + role.name(), errno_name(err) + " (it goes when the file closes)");
  }
  if (std::string why = detail::unlink_if_last(sys, s.fd.get(), s.dir.get(), s.name, s.st);
      !why.empty())
    failed("last-out", why);
  if (const int err = s.fd.reset()) failed("close", errno_name(err));
  if (const int err = s.dir.reset()) failed("close (shm dir)", errno_name(err));
  return ok;
}

}  // namespace kvoffload
