// Creation races: 8 threads and 4 forked processes per round call create_or_join on one engine id
// at once. Exactly one of them creates; everyone sees everyone's writes; the last one out unlinks.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/region.hpp>

#include "region_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload {
namespace {

using test::TempDir;

constexpr std::uint32_t kThreads = 8;
constexpr std::uint32_t kProcesses = 4;
constexpr std::uint32_t kParticipants = kThreads + kProcesses;
constexpr std::uint64_t kSlotBytes = 256;
constexpr std::uint64_t kChunks = 3;

// One participant: attach as `rank`, write its pattern into its slots, publish a flag, wait for
// every other flag, verify every other pattern. Returns 1 when it created, 0 when it joined,
// and throws or returns >= 2 on failure.
int participate(const std::filesystem::path& dir, std::uint32_t rank, std::uint64_t round) {
  RegionOptions o;
  o.engine_id = "race";
  o.layout = {.num_chunks = kChunks, .slot_bytes = kSlotBytes, .world_size = kParticipants};
  o.rank = rank;
  o.shm_dir = dir;
  o.join_timeout = std::chrono::seconds(20);
  Region region = Region::create_or_join(o);
  const auto pattern = static_cast<std::byte>(rank + 1);
  for (std::uint64_t c = 0; c < kChunks; ++c) {
    auto s = region.slot(c);
    std::memset(s.data() + 8, static_cast<int>(pattern), s.size() - 8);
  }
  // The flag is the first 8 bytes of the rank's slot in chunk 0: the round number, released.
  std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(region.slot(0).data()))
      .store(round, std::memory_order_release);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (std::uint32_t r = 0; r < kParticipants; ++r) {
    std::atomic_ref<std::uint64_t> flag(
        *reinterpret_cast<std::uint64_t*>(region.slot(0, r).data()));
    while (flag.load(std::memory_order_acquire) != round) {
      if (std::chrono::steady_clock::now() > deadline) return 2;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (std::uint64_t c = 0; c < kChunks; ++c) {
      const auto s = region.slot(c, r);
      for (std::size_t i = 8; i < s.size(); ++i) {
        if (s[i] != static_cast<std::byte>(r + 1)) return 3;
      }
    }
  }
  return region.role() == RegionRole::kCreator ? 1 : 0;
}

TEST(RegionRace, OneCreatorManyJoinersAcrossThreadsAndProcesses) {
  const TempDir dir;
  constexpr int kRounds = 15;
  for (int round = 1; round <= kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Processes first (forked while this process has a single thread), then the threads.
    std::vector<pid_t> children;
    for (std::uint32_t p = 0; p < kProcesses; ++p) {
      children.push_back(
          test::fork_child([&, p] { return participate(dir.path(), kThreads + p, round); }));
    }
    std::atomic<int> creators{0};
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (std::uint32_t t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          const int rc = participate(dir.path(), t, round);
          if (rc == 1) ++creators;
          if (rc >= 2) ++failures;
        } catch (const std::exception& e) {
          ADD_FAILURE() << "thread " << t << ": " << e.what();
          ++failures;
        }
      });
    }
    for (auto& th : threads) th.join();
    for (const pid_t pid : children) {
      const int status = test::wait_child(pid);
      ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
      const int rc = WEXITSTATUS(status);
      if (rc == 1) ++creators;
      if (rc >= 2) ++failures;
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(creators.load(), 1);
    EXPECT_TRUE(dir.entries().empty());  // the last one out unlinked it
  }
}

}  // namespace
}  // namespace kvoffload
