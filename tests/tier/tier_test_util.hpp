#pragma once
// Helpers for the tier tests: a disk-backed temporary directory. Directories, descriptor and
// mapping snapshots and the fault-injecting Syscalls table (FaultSyscalls) come from the shared
// kit (tests/support).

#include <filesystem>

#include <kvoffload/file_tier.hpp>

#include "fault_syscalls.hpp"
#include "test_env.hpp"

namespace kvoffload::test {

// Tier files live on a disk filesystem by default (O_DIRECT, real fsync), unlike the kit's
// TempDir, which defaults to /dev/shm.
class DiskTempDir : public TempDir {
 public:
  DiskTempDir() : TempDir(std::filesystem::temp_directory_path()) {}
  explicit DiskTempDir(const std::filesystem::path& base) : TempDir(base) {}
};

}  // namespace kvoffload::test
