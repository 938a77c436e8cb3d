#pragma once
// Roles in a region: one holder per rank slot and one scheduler, each a lock that dies with its
// process.
//
// Note [Owners]
// ~~~~~~~~~~~~~
// Two writers of one slot corrupt KV silently: a second `kvoffload run --engine-id X` whose
// scheduler hands out the slots the first one handed out, a rank started twice, two data-parallel
// replicas given one engine id. So a region has roles: rank r (0 .. world_size-1), the holder of
// rank r's slots, and the scheduler, the one unranked mapper (its Manager hands out the slots).
// Every create_or_join takes the role its options name; while another process holds it the call
// fails with Error(kInUse) naming the engine id, the role, the holder's PID and what to do.
//
// A role is an OFD write lock (F_OFD_SETLK) on byte 0 of the role's record in the owner table
// (header.hpp, OwnerRecord; ranks first, then the scheduler). OFD locks belong to the open file
// description, so:
//   - they die with the process, kill -9 included: a restarted rank or scheduler takes its role at
//     once, with no lease, heartbeat or stale-owner clean-up;
//   - two Regions in one process (or two threads) conflict like two processes, each having its
//     own open of the file;
//   - unlike classic POSIX locks, closing some other descriptor of the file (`region list`, a
//     second Region that was refused) does not drop them.
// F_OFD_GETLK reports no PID (l_pid is -1), so the holder writes its PID into the record. A
// claimant may look between the holder's lock and its write, or at a record a killed holder left
// behind, so the record is trusted only while byte 1 of it is locked too: the holder locks byte 0,
// writes its PID, then locks byte 1 ("recorded"). A refused claimant reads the PID when byte 1 is
// locked; otherwise the holder is between its steps (or leaving), and it tries again for a short
// while before it reports the role held by an unknown PID. Release is the reverse: unlock byte 1,
// clear the PID, unlock byte 0 (closing the descriptor drops both anyway).
//
// The creator takes its role on the unnamed O_TMPFILE file, before linkat makes it visible, so it
// never loses its own role to a joiner; a joiner takes its role once the region is ready, before it
// maps. These byte-range locks are a kind apart from the liveness flock (Note [Region lifetime]):
// they are not counted as attached and do not change who unlinks. Readers take no role and no
// lock: `region list` finds the held "recorded" bytes among the OFD locks in /proc/locks and reads
// the PIDs with pread.

#include <sys/stat.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "region/header.hpp"
#include "sys/syscalls.hpp"

namespace kvoffload::detail {

// A role of a region of `world_size` ranks: rank `rank`, or the scheduler when it is nullopt.
struct Role {
  std::uint32_t world_size = 1;
  std::optional<std::uint32_t> rank;

  // Position in the owner table: the rank, or world_size for the scheduler.
  [[nodiscard]] std::uint32_t index() const noexcept { return rank ? *rank : world_size; }
  // File offset of the role's record (its locks are on its first two bytes).
  [[nodiscard]] std::uint64_t record_offset() const noexcept {
    return owners_offset_for(world_size) + std::uint64_t{index()} * sizeof(OwnerRecord);
  }
  // "rank 3" | "the scheduler role"
  [[nodiscard]] std::string name() const;
};

// Who holds a role another process has. pid 0: it had not recorded its PID when we gave up
// waiting for it.
struct RoleHolder {
  std::uint32_t pid = 0;
};

// Takes `role` for this process through `fd` (the region file, open read-write) and records our
// PID. Returns nullopt when the role is ours now, or who holds it. Throws Error(kSystem) when a
// lock or the record's write fails; whatever was taken is released first.
std::optional<RoleHolder> claim_role(const Syscalls& sys, int fd, const Role& role,
                                     const std::string& path);

// The refusal a claimant reports: Error(kInUse) naming the region, the engine id, the role, the
// holder's PID and what to do.
Error role_taken(const std::string& path, std::string_view engine_id, const Role& role,
                 const RoleHolder& holder);

// Gives the role up (Note [Owners]). Never throws; returns 0 or the errno of the first step that
// failed (every step runs; closing the descriptor drops the locks anyway).
int release_role(const Syscalls& sys, int fd, const Role& role) noexcept;

// The roles held now in the region open as `fd` (any access mode), from the OFD write locks of
// /proc/locks (`proc_locks`, its text) and the PIDs in the owner table. Takes no lock.
std::vector<RegionOwner> held_roles(const Syscalls& sys, int fd, const struct stat& st,
                                    const RegionHeader& header, std::string_view proc_locks,
                                    const std::string& path);

}  // namespace kvoffload::detail
