#include "region/owners.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <set>
#include <thread>

#include "region/proc_locks.hpp"
#include "sys/sys.hpp"

namespace kvoffload::detail {
namespace {

// How long a refused claimant waits for the holder to record its PID (Note [Owners]); the holder
// needs one pwrite and one fcntl, so this is only reached when it is stopped between the two.
constexpr auto kRecordWait = std::chrono::seconds(1);

// The role's lock and its "recorded" lock: bytes 0 and 1 of its record.
off_t role_byte(const Role& role) {
  return static_cast<off_t>(role.record_offset());
}
off_t recorded_byte(const Role& role) {
  return static_cast<off_t>(role.record_offset() + 1);
}

struct flock byte_lock(short type, off_t offset) {
  struct flock l {};
  l.l_type = type;
  l.l_whence = SEEK_SET;
  l.l_start = offset;
  l.l_len = 1;
  return l;
}

// F_OFD_SETLK of one byte; -1 with errno on failure (EAGAIN/EACCES: another holder).
int set_byte(const Syscalls& sys, int fd, short type, off_t offset) {
  struct flock l = byte_lock(type, offset);
  return retry_eintr([&] { return sys.fcntl_lock(sys.context, fd, F_OFD_SETLK, &l); });
}

// Whether another open file description holds a lock on the byte (F_OFD_GETLK; takes nothing).
bool byte_held(const Syscalls& sys, int fd, off_t offset, const std::string& what) {
  struct flock l = byte_lock(F_WRLCK, offset);
  if (retry_eintr([&] { return sys.fcntl_lock(sys.context, fd, F_OFD_GETLK, &l); }) != 0) {
    throw_system_error("fcntl", errno, "(F_OFD_GETLK) " + what);
  }
  return l.l_type != F_UNLCK;
}

}  // namespace

std::string Role::name() const {
  return rank ? "rank " + std::to_string(*rank) : std::string("the scheduler role");
}

std::optional<RoleHolder> claim_role(const Syscalls& sys, int fd, const Role& role,
                                     const std::string& path) {
  const std::string what = "of " + role.name() + " of region " + path;
  const auto deadline = std::chrono::steady_clock::now() + kRecordWait;
  for (;;) {
    if (set_byte(sys, fd, F_WRLCK, role_byte(role)) == 0) break;
    if (errno != EAGAIN && errno != EACCES) {
      throw_system_error("fcntl", errno,
                         "(F_OFD_SETLK) claiming " + role.name() + " of region " + path);
    }
    // Taken. The PID in the record is the holder's only while its "recorded" byte is locked.
    if (byte_held(sys, fd, recorded_byte(role), what)) {
      const OwnerRecord record = read_owner(sys, fd, role.record_offset(), path);
      if (record.pid != 0) return RoleHolder{record.pid};
      // Cleared: the holder is leaving; the role may be free on the next try.
    }
    if (std::chrono::steady_clock::now() >= deadline) return RoleHolder{};
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Ours: record the PID, then say it is recorded.
  try {
    write_owner(sys, fd, role.record_offset(),
                OwnerRecord{.pid = static_cast<std::uint32_t>(::getpid()), .reserved = 0}, path);
    if (set_byte(sys, fd, F_WRLCK, recorded_byte(role)) != 0) {
      throw_system_error("fcntl", errno, "(F_OFD_SETLK) recording the holder " + what);
    }
  } catch (...) {
    (void)set_byte(sys, fd, F_UNLCK, role_byte(role));
    throw;
  }
  return std::nullopt;
}

Error role_taken(const std::string& path, std::string_view engine_id, const Role& role,
                 const RoleHolder& holder) {
  const std::string who = holder.pid != 0
                              ? "PID " + std::to_string(holder.pid)
                              : std::string("another process (it had not recorded its PID yet)");
  const std::string id(engine_id);
  std::string message =
      "region " + path + ": " + role.name() + " of engine '" + id + "' is held by " + who + ". ";
  if (role.rank) {
    message +=
        "A rank slot has one holder at a time: two processes on one rank would overwrite "
        "each other's KV. ";
  } else {
    message +=
        "An engine has one scheduler (the unranked mapper that hands out slots): two "
        "would hand out the same slots and serve each other's KV. ";
  }
  const std::string stop =
      holder.pid != 0 ? "stop " + who : std::string("stop the process that holds it");
  message += "If it is an earlier run of this " + std::string(role.rank ? "rank" : "engine") +
             ", " + stop +
             " first (the role is freed as soon as it exits, kill -9 included; `kvoffload region "
             "list` shows the holders); if it is another engine or data-parallel replica, give "
             "each its own engine id (--engine-id, kvoffload_engine_id)";
  return {ErrorCode::kInUse, message};
}

int release_role(const Syscalls& sys, int fd, const Role& role) noexcept {
  int first = 0;
  auto note = [&](int rc) {
    if (rc != 0 && first == 0) first = errno;
  };
  note(set_byte(sys, fd, F_UNLCK, recorded_byte(role)));
  try {
    write_owner(sys, fd, role.record_offset(), OwnerRecord{}, "");
  } catch (const Error& e) {
    if (first == 0) first = e.sys_errno() != 0 ? e.sys_errno() : EIO;
  }
  note(set_byte(sys, fd, F_UNLCK, role_byte(role)));
  return first;
}

std::vector<RegionOwner> held_roles(const Syscalls& sys, int fd, const struct stat& st,
                                    const RegionHeader& header, std::string_view proc_locks,
                                    const std::string& path) {
  const std::uint32_t world_size = header.world_size;
  const std::uint64_t table = owners_offset_for(world_size);
  if (header.owners_offset != table) return {};  // not a table this version wrote
  // Role i's "recorded" byte is table + i * record + 1; a holder's two bytes show as one range.
  std::set<std::uint32_t> held;
  for (const LockedRange& r : ofd_write_locks(proc_locks, st.st_dev, st.st_ino)) {
    if (r.last < table + 1) continue;
    const std::uint64_t from =
        r.first <= table + 1
            ? 0
            : (r.first - table - 1 + sizeof(OwnerRecord) - 1) / sizeof(OwnerRecord);
    const std::uint64_t to =
        std::min<std::uint64_t>((r.last - table - 1) / sizeof(OwnerRecord), world_size);
    for (std::uint64_t i = from; i <= to; ++i) held.insert(static_cast<std::uint32_t>(i));
  }
  std::vector<RegionOwner> owners;
  for (const std::uint32_t index : held) {
    const Role role{.world_size = world_size,
                    .rank = index < world_size ? std::optional(index) : std::nullopt};
    owners.push_back(
        RegionOwner{.rank = role.rank, .pid = read_owner(sys, fd, role.record_offset(), path).pid});
  }
  return owners;
}

}  // namespace kvoffload::detail
