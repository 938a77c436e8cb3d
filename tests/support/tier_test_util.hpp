#pragma once
// Helpers for the tier tests: a disk-backed temporary directory and pattern(n, seed), the bytes
// every tier suite stores. Directories, descriptor and
// mapping snapshots and the fault-injecting Syscalls table (FaultSyscalls) come from the shared
// kit (tests/support).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

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

// n bytes that depend on `seed` (an mt19937 stream), so a row read back can be told from another.
inline std::vector<std::byte> pattern(std::size_t n, std::uint32_t seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng() & 0xFF);
  return v;
}

}  // namespace kvoffload::test
