#pragma once
// Counting the holders of a region's shared flock without taking a lock (docs/DESIGN.md §3.7: a
// probing lock in `list` could beat the last process out to its exclusive lock and leave a stale
// file behind).

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sys/syscalls.hpp"

namespace kvoffload::detail {

// Number of granted FLOCK entries in the text of /proc/locks for the file (dev, ino). Blocked
// waiters ("->" lines) and POSIX/OFD byte-range locks are not holders.
std::uint32_t count_flock_holders(std::string_view proc_locks, dev_t dev, ino_t ino);

// An inclusive byte range [first, last] of a lock (last: the largest value for "to EOF").
struct LockedRange {
  std::uint64_t first = 0;
  std::uint64_t last = 0;
};

// The granted OFD write locks (F_OFD_SETLK, "OFDLCK ... WRITE") on the file (dev, ino) in the text
// of /proc/locks. Lets `region list` see which roles are held without taking a lock itself
// (Note [Owners] in owners.hpp).
std::vector<LockedRange> ofd_write_locks(std::string_view proc_locks, dev_t dev, ino_t ino);

// Reads /proc/locks into *text as one consistent listing: the kernel hands the file out a page
// per read(), restarting each page by position, so a lock taken or dropped elsewhere between two
// pages can drop or repeat another line (a holder counted twice or not at all). Reads until two
// whole reads agree, at most 8 times (then the last one). 0, or the errno of a failed read.
int read_proc_locks(const Syscalls& sys, std::string* text);

// Reads /proc/locks and counts; throws Error(kSystem) when it cannot be read.
std::uint32_t flock_holders(const Syscalls& sys, dev_t dev, ino_t ino);

}  // namespace kvoffload::detail
