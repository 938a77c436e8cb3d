#pragma once
// Counting the holders of a region's shared flock without taking a lock (DESIGN §2 notes: a
// probing lock in `list` could beat the last process out to its exclusive lock and leave a stale
// file behind).

#include <sys/types.h>

#include <cstdint>
#include <string_view>

#include "kvoffload/syscalls.hpp"

namespace kvoffload::detail {

// Number of granted FLOCK entries in the text of /proc/locks for the file (dev, ino). Blocked
// waiters ("->" lines) and POSIX/OFD byte-range locks are not holders.
std::uint32_t count_flock_holders(std::string_view proc_locks, dev_t dev, ino_t ino);

// Reads /proc/locks and counts; throws Error(kSystem) when it cannot be read.
std::uint32_t flock_holders(const Syscalls& sys, dev_t dev, ino_t ino);

}  // namespace kvoffload::detail
