#pragma once
// The one rule for what a process may remove from a shm dir, shared by `region clean`
// (listing.cpp) and by the reclaim of a stale file when a region is created (attach.cpp).

#include <sys/stat.h>

#include <string>

#include "sys/syscalls.hpp"

namespace kvoffload::detail {

// Note [What is ours to remove]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A file named like a region is removed only when it is provably a region of this user that
// nothing holds:
//   provably ours  a regular file owned by this user with mode 0600 (what creators make), whose
//                  header has our magic and version, a checksum that matches (Note [Header
//                  checksum] in header.hpp), a geometry that computes and a size equal to what
//                  that geometry needs;
//                  A region of an older format (1 to 3, no checksum) is provably ours when its
//                  header has our magic and its recorded layout accounts for the file's size
//                  exactly (Note [Old formats] in header.hpp);
//   unheld         a non-blocking LOCK_EX on it wins: no process holds the liveness lock.
// A creator publishes a file only after writing its header and setting its size (Note [Region
// lifetime]), so every file a kvoffload process left behind passes the first test. Anything else
// (a junk file, a header written by a newer format, a damaged header, another user's
// file, a wider mode) is left where it is with the reason: `region clean` reports it as skipped,
// `region list` as "not a region", and a process creating the region refuses with that reason
// instead of removing it. docs/OPERATING.md ("Full disks and hostile shm entries") states the
// same rule.

// Why the regular file open at `fd` (its stat `st`) is not provably a region of this user, as a
// short reason ending in "not a region file" or naming the owner or mode; "" when it is ours.
// Held or not is the caller's question (it must ask with a lock on the same descriptor).
std::string why_not_ours(const Syscalls& sys, int fd, const struct stat& st,
                         const std::string& path);

}  // namespace kvoffload::detail
