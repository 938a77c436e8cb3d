#pragma once
// Opening a root a previous owner used: its records are indexed (by name and size, no reads),
// oldest first, and its temporary files deleted (the caller holds the root's lock, so no writer
// is alive).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <kvoffload/block_key.hpp>
#include <kvoffload/file_tier.hpp>

#include "sys/syscalls.hpp"

namespace kvoffload::detail {

struct RecoveredRecord {
  BlockKey key;
  std::uint64_t file_bytes = 0;
};

struct Recovery {
  std::vector<RecoveredRecord> records;  // oldest (by mtime) first
  std::uint64_t stale_temps_removed = 0;
};

// Throws Error(kSystem) when a directory of the root cannot be read.
Recovery recover_root(const Syscalls& sys, const std::filesystem::path& root,
                      const std::string& tier_name);

}  // namespace kvoffload::detail
