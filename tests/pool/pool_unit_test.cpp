// The node pool's operations, one behaviour per case (docs/DESIGN.md §6.6).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>

#include "pool_helpers.hpp"
#include "test_env.hpp"

namespace kvoffload::pool {
namespace {

using test::keys;
using test::small_options;
using ::testing::AllOf;
using ::testing::HasSubstr;

template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no kvoffload::Error was thrown";
  return Error(ErrorCode::kOk, "");
}

TEST(PoolUnit, LastTenantOutRemovesThePoolFile) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  auto b = NodePool::attach(small_options(dir.path(), "b"));
  const auto path = a.path();
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(a.stats().tenants.size(), 2U);
  a.detach();
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(b.stats().tenants.size(), 1U);
  b.detach();
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(PoolUnit, AChunkStoredByOneEngineIsAHitForAnotherWithItsBytes) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  auto b = NodePool::attach(small_options(dir.path(), "b"));
  const auto ks = keys(0, 4);
  EXPECT_EQ(test::store(a, ks), 4U);
  const LookupOutcome own = a.lookup(ks, false);
  EXPECT_EQ(own.hits, 4U);
  EXPECT_EQ(own.cross_engine_hits, 0U);
  EXPECT_EQ(test::load_verified(b, ks), 4U);
  const auto st = b.stats();
  ASSERT_EQ(st.tenants.size(), 2U);
  EXPECT_EQ(st.tenants[1].engine_id, "b");
  EXPECT_EQ(st.tenants[1].cross_engine_hits, 4U);
  EXPECT_EQ(st.tenants[0].cross_engine_hits, 0U);
  EXPECT_EQ(st.tenants[0].occupancy, 4U);
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, AChunkBeingWrittenIsInvisibleAndNotWrittenTwice) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  auto b = NodePool::attach(small_options(dir.path(), "b"));
  const auto ks = keys(10, 2);
  const StoreOutcome sa = a.prepare_stores(ks);
  ASSERT_EQ(sa.slots.size(), 2U);
  const std::vector<std::uint32_t> slots(sa.slots.begin(), sa.slots.end());
  EXPECT_EQ(b.lookup(ks, true).hits, 0U);
  const StoreOutcome sb = b.prepare_stores(ks);
  EXPECT_EQ(sb.slots.size(), 0U);
  EXPECT_EQ(sb.skipped_writing, 2U);
  // The same key twice in one call is written once.
  const std::vector<BlockKey> twice{test::key(50), test::key(50)};
  const StoreOutcome st = b.prepare_stores(twice);
  EXPECT_EQ(st.slots.size(), 1U);
  EXPECT_EQ(st.skipped_writing, 1U);
  b.abort_stores(std::vector<std::uint32_t>(st.slots.begin(), st.slots.end()));
  for (std::size_t i = 0; i < slots.size(); ++i) test::write_chunk(a, slots[i], ks[i]);
  a.commit_stores(slots);
  EXPECT_EQ(test::load_verified(b, ks), 2U);
  EXPECT_EQ(b.prepare_stores(ks).skipped_present, 2U);
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, EvictsTheLeastRecentChunkNeverOnePinnedByAnyTenant) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a", 4));
  auto b = NodePool::attach(small_options(dir.path(), "b", 4));
  for (int i = 0; i < 4; ++i) test::store(a, keys(i, 1));  // key 0 least recent
  const std::vector<BlockKey> k0{test::key(0)};
  const LookupOutcome pinned = b.lookup(k0, true);  // b pins key 0
  ASSERT_EQ(pinned.hits, 1U);
  const StoreOutcome s = a.prepare_stores(keys(100, 1));
  ASSERT_EQ(s.evicted.size(), 1U);
  EXPECT_EQ(s.evicted[0], test::key(1));
  a.commit_stores(std::vector<std::uint32_t>(s.slots.begin(), s.slots.end()));
  // A lookup makes key 2 most recent: key 3 goes next.
  EXPECT_EQ(a.lookup(keys(2, 1), false).hits, 1U);
  const StoreOutcome s2 = a.prepare_stores(keys(101, 1));
  ASSERT_EQ(s2.evicted.size(), 1U);
  EXPECT_EQ(s2.evicted[0], test::key(3));
  EXPECT_POOL_OK(a);
  // Unpinned, key 0 re-enters as the most recent.
  b.unpin(std::vector<std::uint32_t>(pinned.slots.begin(), pinned.slots.end()));
  a.commit_stores(std::vector<std::uint32_t>(s2.slots.begin(), s2.slots.end()));
  const StoreOutcome s3 = a.prepare_stores(keys(102, 1));
  ASSERT_EQ(s3.evicted.size(), 1U);
  EXPECT_EQ(s3.evicted[0], test::key(100));
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, NoRoomWhenEverythingIsPinnedOrBeingWritten) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a", 3));
  test::store(a, keys(0, 2));
  ASSERT_EQ(a.lookup(keys(0, 2), true).hits, 2U);
  const StoreOutcome s = a.prepare_stores(keys(10, 3));
  EXPECT_EQ(s.slots.size(), 1U);
  EXPECT_EQ(s.skipped_no_room, 2U);
  EXPECT_TRUE(s.evicted.empty());
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, ALookupAndPrepareNeverEvictsItsOwnHits) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a", 3));
  test::store(a, keys(0, 3));  // full; key 0 least recent
  std::vector<BlockKey> req = keys(0, 1);
  req.push_back(test::key(50));
  const NodePool::Cycle c = a.lookup_and_prepare(req, false);
  EXPECT_EQ(c.lookup.hits, 1U);
  ASSERT_EQ(c.store.positions.size(), 1U);
  EXPECT_EQ(c.store.positions[0], 1U);
  ASSERT_EQ(c.store.evicted.size(), 1U);
  EXPECT_EQ(c.store.evicted[0], test::key(1));
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, ATenantAtItsCapEvictsOnlyItsOwnChunks) {
  const kvoffload::test::TempDir dir;
  auto b = NodePool::attach(small_options(dir.path(), "b", 8));
  auto ao = small_options(dir.path(), "a", 8);
  ao.cap_fraction = 0.375;  // 3 of 8
  auto a = NodePool::attach(ao);
  test::store(b, keys(0, 4));
  for (int i = 0; i < 10; ++i) test::store(a, keys(100 + i, 1));
  EXPECT_EQ(a.lookup(keys(0, 4), false).hits, 4U);  // b's chunks all survived
  EXPECT_EQ(a.lookup(keys(107, 3), false).hits, 3U);
  const auto st = a.stats();
  EXPECT_EQ(st.tenants[1].occupancy, 3U);
  EXPECT_EQ(st.tenants[1].cap_slots, 3U);
  // At the cap with nothing of its own evictable (all being written): skipped, not an error.
  const StoreOutcome s = a.prepare_stores(keys(200, 5));
  EXPECT_EQ(s.slots.size(), 3U);  // each evicts one of its own ready chunks
  EXPECT_EQ(s.skipped_cap, 2U);
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, ACapInBytesCountsWholeChunks) {
  const kvoffload::test::TempDir dir;
  auto o = small_options(dir.path(), "a", 8);
  o.cap_bytes = 1;  // less than one chunk
  const Error e = error_of([&] { (void)NodePool::attach(o); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.what(), HasSubstr("less than one chunk of 1024 bytes"));  // 2 ranks x 512
}

TEST(PoolUnit, ATenantOfAnotherGeometryOrFingerprintIsRefusedNamingBothValues) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  auto o = small_options(dir.path(), "b");
  o.geometry.slot_bytes = 1024;
  Error e = error_of([&] { (void)NodePool::attach(o); });
  EXPECT_EQ(e.code(), ErrorCode::kMismatch);
  EXPECT_THAT(e.what(), HasSubstr("slot_bytes is 512 in the pool, 1024 for engine 'b'"));
  o = small_options(dir.path(), "b");
  o.geometry.fingerprint = "mistral-7b/ns0";
  o.geometry.dtype = "fp8";
  e = error_of([&] { (void)NodePool::attach(o); });
  EXPECT_EQ(e.code(), ErrorCode::kMismatch);
  EXPECT_THAT(e.what(),
              AllOf(HasSubstr("fingerprint is 'llama-3-8b/ns0' in the pool, 'mistral-7b/ns0'"),
                    HasSubstr("dtype is 'bf16' in the pool, 'fp8'")));
  for (auto change : {+[](PoolOptions& p) { p.geometry.slot_count = 9; },
                      +[](PoolOptions& p) { p.geometry.world_size = 4; },
                      +[](PoolOptions& p) { p.geometry.layout = "kv_major"; }}) {
    o = small_options(dir.path(), "b");
    change(o);
    EXPECT_EQ(error_of([&] { (void)NodePool::attach(o); }).code(), ErrorCode::kMismatch);
  }
  EXPECT_EQ(a.stats().tenants.size(), 1U);
}

TEST(PoolUnit, ATenantAskingForTheOtherPolicyIsRefusedNamingBoth) {
  const kvoffload::test::TempDir dir;
  auto ao = small_options(dir.path(), "a");
  ao.policy = PolicyKind::kArc;
  auto a = NodePool::attach(ao);
  const Error e = error_of([&] { (void)NodePool::attach(small_options(dir.path(), "b")); });
  EXPECT_EQ(e.code(), ErrorCode::kMismatch);
  EXPECT_THAT(e.what(), HasSubstr("policy is 'arc' in the pool, 'lru' for engine 'b'"));
  auto bo = small_options(dir.path(), "b");
  bo.policy = PolicyKind::kArc;
  auto b = NodePool::attach(bo);
  EXPECT_EQ(b.stats().policy, PolicyKind::kArc);
  EXPECT_EQ(a.stats().tenants.size(), 2U);
}

// ARC keeps a chunk seen twice through a scan of chunks seen once, which LRU loses; a key
// evicted from T1 and stored again is a ghost hit in B1: the T1 target grows and it enters T2.
TEST(PoolUnit, ArcKeepsAChunkSeenTwiceThroughAScanThatLruLoses) {
  for (const PolicyKind policy : {PolicyKind::kLru, PolicyKind::kArc}) {
    const kvoffload::test::TempDir dir;
    auto o = small_options(dir.path(), "a", 4);
    o.policy = policy;
    auto a = NodePool::attach(o);
    test::store(a, keys(0, 4));
    ASSERT_EQ(a.lookup(keys(0, 1), false).hits, 1U);  // key 0 seen again (ARC: T2)
    for (int i = 0; i < 4; ++i) test::store(a, keys(10 + i, 1));
    const bool arc = policy == PolicyKind::kArc;
    EXPECT_EQ(a.lookup(keys(0, 1), false).hits, arc ? 1U : 0U) << to_string(policy);
    PoolStats st = a.stats();
    EXPECT_EQ(st.frequent, arc ? 1U : 0U);
    EXPECT_EQ(st.ghost_recent, arc ? 1U : 0U);  // keys 1, 2, 3 went; |T1| + |B1| <= 4 kept 10
    // Under ARC key 10 is a ghost now (LRU: still resident): storing it again evicts T1's least
    // recent (key 11), then finds the ghost, raises p by max(1, |B2| / |B1|) and enters T2.
    const StoreOutcome again = a.prepare_stores(keys(10, 1));
    EXPECT_EQ(again.skipped_present, arc ? 0U : 1U);
    ASSERT_EQ(again.evicted.size(), arc ? 1U : 0U);
    if (arc) {
      EXPECT_EQ(again.evicted[0], test::key(11));
    }
    a.commit_stores(std::vector<std::uint32_t>(again.slots.begin(), again.slots.end()));
    st = a.stats();
    EXPECT_EQ(st.arc_target, arc ? 1U : 0U) << to_string(policy);
    EXPECT_EQ(st.frequent, arc ? 2U : 0U);
    EXPECT_EQ(st.ghost_recent, arc ? 1U : 0U);  // key 11
    EXPECT_POOL_OK(a);
  }
}

TEST(PoolUnit, TheSameEngineTwiceIsRefusedWithThePid) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  const Error e = error_of([&] { (void)NodePool::attach(small_options(dir.path(), "a")); });
  EXPECT_EQ(e.code(), ErrorCode::kInUse);
  EXPECT_THAT(e.what(), HasSubstr("PID " + std::to_string(::getpid())));
}

TEST(PoolUnit, AFullTenantTableIsRefused) {
  const kvoffload::test::TempDir dir;
  auto o = small_options(dir.path(), "a");
  o.max_tenants = 2;
  auto a = NodePool::attach(o);
  auto b = NodePool::attach(small_options(dir.path(), "b"));
  const Error e = error_of([&] { (void)NodePool::attach(small_options(dir.path(), "c")); });
  EXPECT_EQ(e.code(), ErrorCode::kCapacity);
  EXPECT_THAT(e.what(), HasSubstr("all 2 tenant records"));
  b.detach();
  EXPECT_NO_THROW((void)NodePool::attach(small_options(dir.path(), "c")));
}

TEST(PoolUnit, BadOptionsAreRefusedNamingTheValue) {
  const kvoffload::test::TempDir dir;
  struct Case {
    void (*change)(PoolOptions&);
    const char* text;
  };
  const Case cases[] = {
      {[](PoolOptions& o) { o.name = "a/b"; }, "node pool name 'a/b' contains the character '/'"},
      {[](PoolOptions& o) { o.engine_id = ""; }, "engine id '' has 0 characters"},
      {[](PoolOptions& o) { o.geometry.slot_count = 0; }, "slot_count 0 is out of range"},
      {[](PoolOptions& o) { o.geometry.slot_bytes = 0; }, "slot_bytes 0 is out of range"},
      {[](PoolOptions& o) { o.geometry.world_size = 2000; }, "world_size 2000 is out of range"},
      {[](PoolOptions& o) { o.geometry.fingerprint = ""; }, "fingerprint '' has 0 characters"},
      {[](PoolOptions& o) { o.max_tenants = 65; }, "max_tenants 65 is out of range"},
      {[](PoolOptions& o) { o.cap_fraction = 1.5; }, "cap_fraction 1.500000 is out of range"},
      {[](PoolOptions& o) {
         o.cap_fraction = 0.5;
         o.cap_bytes = 10;
       },
       "are both set"},
      {[](PoolOptions& o) { o.lock_timeout = std::chrono::milliseconds(0); }, "lock_timeout 0 ms"},
      {[](PoolOptions& o) { o.policy = static_cast<PolicyKind>(5); },
       "node pool policy 5 is unknown; it must be lru or arc"},
  };
  for (const Case& c : cases) {
    auto o = small_options(dir.path(), "a");
    c.change(o);
    const Error e = error_of([&] { (void)NodePool::attach(o); });
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << c.text;
    EXPECT_THAT(e.what(), HasSubstr(c.text));
  }
  EXPECT_TRUE(dir.entries().empty());
}

TEST(PoolUnit, CommitAbortAndUnpinRefuseWhatIsNotThisTenantsAndChangeNothing) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  auto b = NodePool::attach(small_options(dir.path(), "b"));
  const StoreOutcome s = a.prepare_stores(keys(0, 2));
  const std::vector<std::uint32_t> slots(s.slots.begin(), s.slots.end());
  EXPECT_EQ(error_of([&] { b.commit_stores(slots); }).code(), ErrorCode::kState);
  EXPECT_EQ(error_of([&] { b.abort_stores(slots); }).code(), ErrorCode::kState);
  const std::vector<std::uint32_t> twice{slots[0], slots[0]};
  EXPECT_THAT(error_of([&] { a.commit_stores(twice); }).what(), HasSubstr("given twice"));
  const std::vector<std::uint32_t> out_of_range{slots[0], 99};
  EXPECT_EQ(error_of([&] { a.commit_stores(out_of_range); }).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(a.stats().writing, 2U);  // nothing committed by the refused calls
  for (std::size_t i = 0; i < 2; ++i) test::write_chunk(a, slots[i], test::key(i));
  a.commit_stores(slots);
  EXPECT_EQ(error_of([&] { a.commit_stores(slots); }).code(), ErrorCode::kState);
  const LookupOutcome l = b.lookup(keys(0, 1), true);
  const std::vector<std::uint32_t> pin_twice{l.slots[0], l.slots[0]};
  const Error e = error_of([&] { b.unpin(pin_twice); });
  EXPECT_EQ(e.code(), ErrorCode::kState);
  EXPECT_THAT(e.what(), HasSubstr("given 2 times but this tenant pins it 1 times"));
  EXPECT_EQ(error_of([&] { a.unpin(std::vector<std::uint32_t>{l.slots[0]}); }).code(),
            ErrorCode::kState);
  EXPECT_EQ(a.stats().pinned, 1U);
  b.unpin(std::vector<std::uint32_t>{l.slots[0]});
  EXPECT_EQ(a.stats().pinned, 0U);
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, AnAbortedStoreFreesItsSlotAndForgetsTheKey) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  const StoreOutcome s = a.prepare_stores(keys(0, 1));
  a.abort_stores(std::vector<std::uint32_t>(s.slots.begin(), s.slots.end()));
  EXPECT_EQ(a.stats().free, 8U);
  EXPECT_EQ(test::store(a, keys(0, 1)), 1U);
  EXPECT_EQ(test::load_verified(a, keys(0, 1)), 1U);
  EXPECT_POOL_OK(a);
}

TEST(PoolUnit, DetachDropsPinsAndWritesButLeavesReadyChunksToTheOthers) {
  const kvoffload::test::TempDir dir;
  auto a = NodePool::attach(small_options(dir.path(), "a", 4));
  auto b = NodePool::attach(small_options(dir.path(), "b", 4));
  test::store(a, keys(0, 2));
  ASSERT_EQ(a.lookup(keys(0, 1), true).hits, 1U);
  ASSERT_EQ(a.prepare_stores(keys(9, 1)).slots.size(), 1U);
  a.detach();
  EXPECT_EQ(test::load_verified(b, keys(0, 2)), 2U);
  const auto st = b.stats();
  EXPECT_EQ(st.writing, 0U);
  EXPECT_EQ(st.pinned, 0U);
  EXPECT_EQ(st.ready, 2U);
  EXPECT_EQ(test::store(b, keys(9, 1)), 1U);
  // a's chunks are evictable again: b can fill the pool.
  EXPECT_EQ(test::store(b, keys(20, 3)), 3U);
  EXPECT_POOL_OK(b);
  EXPECT_EQ(error_of([&] { (void)a.lookup(keys(0, 1), false); }).code(), ErrorCode::kState);
}

TEST(PoolUnit, AStalePoolIsReclaimedAndAForeignFileRefused) {
  const kvoffload::test::TempDir dir;
  // A pool whose only tenant was killed: nobody holds it.
  const pid_t pid = kvoffload::test::fork_child([&] {
    auto a = NodePool::attach(small_options(dir.path(), "a"));
    test::store(a, keys(0, 3));
    (void)::raise(SIGKILL);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(kvoffload::test::wait_child(pid)));
  const auto path = pool_path(dir.path(), "testpool");
  ASSERT_TRUE(std::filesystem::exists(path));
  {
    auto b = NodePool::attach(small_options(dir.path(), "b"));
    EXPECT_EQ(b.lookup(keys(0, 3), false).hits, 0U);  // a fresh pool
    EXPECT_EQ(b.stats().tenants.size(), 1U);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  {
    std::ofstream(path) << "not a pool";
    std::filesystem::permissions(
        path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    const Error e = error_of([&] { (void)NodePool::attach(small_options(dir.path(), "b")); });
    EXPECT_EQ(e.code(), ErrorCode::kMismatch);
    EXPECT_THAT(e.what(), HasSubstr("is not a kvoffload node pool"));
    EXPECT_TRUE(std::filesystem::exists(path));
    ::chmod(path.c_str(), 0644);
    const Error p = error_of([&] { (void)NodePool::attach(small_options(dir.path(), "b")); });
    EXPECT_EQ(p.code(), ErrorCode::kPermission);
    EXPECT_THAT(p.what(), HasSubstr("mode 0644"));
  }
}

// Note [Pool layout]: rank r's slot of every chunk is one range of the file, the ranks' ranges one
// after another, so a rank process maps (and registers) only its own.
TEST(PoolUnit, EachRanksSlotsAreOneRangeOfTheFileRankMajor) {
  const kvoffload::test::TempDir dir;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const std::uint32_t world : {1U, 2U, 4U}) {
    auto o = small_options(dir.path(), "a", 5, 1000);  // slots 1024 apart (256-aligned)
    o.geometry.world_size = world;
    auto a = NodePool::attach(o);
    EXPECT_EQ(a.slot_stride(), 1024U);
    const RankRange first = a.rank_range(0);
    for (std::uint32_t r = 0; r < world; ++r) {
      const RankRange range = a.rank_range(r);
      EXPECT_EQ(range.slot_stride, 1024U);
      EXPECT_EQ(range.bytes, (5 * 1024 + page - 1) / page * page) << "one rank's 5 slots";
      EXPECT_EQ(range.file_offset % page, 0U);
      EXPECT_EQ(range.file_offset, first.file_offset + r * range.bytes);
      EXPECT_EQ(range.data, first.data + r * range.bytes);
      for (std::uint32_t s = 0; s < 5; ++s) EXPECT_EQ(a.chunk(s, r), range.data + s * 1024);
    }
    const RankRange last = a.rank_range(world - 1);
    EXPECT_EQ(std::filesystem::file_size(a.path()), last.file_offset + last.bytes);
    const Error e = error_of([&] { (void)a.rank_range(world); });
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("rank_range(" + std::to_string(world) +
                                    ") is out of range: ranks 0.." + std::to_string(world - 1)));
  }
  // A rank's own mapping of its range (what `kvoffload run`'s ranks map) holds its slots of
  // every chunk a tenant wrote, and only its own.
  auto a = NodePool::attach(small_options(dir.path(), "a"));
  const auto ks = keys(10, 8);
  ASSERT_EQ(test::store(a, ks), 8U);
  const RankRange r1 = a.rank_range(1);
  const int fd = ::open(a.path().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* m =
      ::mmap(nullptr, r1.bytes, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(r1.file_offset));
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  const LookupOutcome got = a.lookup(ks, false);
  ASSERT_EQ(got.hits, 8U);
  for (std::size_t i = 0; i < ks.size(); ++i) {
    const auto* b = static_cast<const std::uint8_t*>(m) + got.slots[i] * r1.slot_stride;
    for (std::uint64_t j = 0; j < 512; ++j) {
      ASSERT_EQ(b[j], test::byte_of(ks[i], 1, j)) << "key " << i << " byte " << j;
    }
  }
  ::munmap(m, r1.bytes);
}

TEST(PoolUnit, APoolTooLargeForAFileIsRefusedNamingItsGeometry) {
  const kvoffload::test::TempDir dir;
  auto o = small_options(dir.path(), "a");
  o.geometry.slot_bytes = std::uint64_t{1} << 40;
  o.geometry.slot_count = 1U << 20;
  const Error e = error_of([&] { (void)NodePool::attach(o); });
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  EXPECT_THAT(e.what(),
              HasSubstr("node pool of 1048576 chunks x 2 ranks x 1099511627776 slot_bytes is "
                        "more than 2^60 bytes"));
}

// Writes format version `version` into the pool file's header (offset 8, after the magic).
void set_version(const std::filesystem::path& path, std::uint32_t version) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &version, sizeof version, 8), static_cast<ssize_t>(sizeof version));
  ::close(fd);
}

// A pool of the chunk-major format 1 (or any other): refused while its tenants run, removed when
// nobody is attached (by a joiner, and by remove_stale_pool, `region clean`'s rule).
TEST(PoolUnit, AnOldFormatPoolIsRefusedWhileInUseAndRemovedWhenStale) {
  const kvoffload::test::TempDir dir;
  const auto path = pool_path(dir.path(), "testpool");
  {
    auto a = NodePool::attach(small_options(dir.path(), "a"));
    set_version(path, 1);
    const Error e = error_of([&] { (void)NodePool::attach(small_options(dir.path(), "b")); });
    EXPECT_EQ(e.code(), ErrorCode::kMismatch);
    EXPECT_THAT(e.what(), AllOf(HasSubstr("has format version 1 (chunk-major"),
                                HasSubstr("reads and writes only version 2")));
    EXPECT_FALSE(remove_stale_pool(path));  // a is attached
    const auto seen = observe_pools(dir.path());
    ASSERT_EQ(seen.size(), 1U);
    EXPECT_THAT(seen[0].problem, HasSubstr("format version 1"));
    set_version(path, 2);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  auto dead_tenant = [&] {
    const pid_t pid = kvoffload::test::fork_child([&] {
      auto a = NodePool::attach(small_options(dir.path(), "a"));
      test::store(a, keys(0, 3));
      (void)::raise(SIGKILL);
      return 0;
    });
    ASSERT_TRUE(WIFSIGNALED(kvoffload::test::wait_child(pid)));
    set_version(path, 1);
  };
  dead_tenant();
  {
    auto b = NodePool::attach(small_options(dir.path(), "b"));  // the stale old file removed
    EXPECT_EQ(b.lookup(keys(0, 3), false).hits, 0U);
    EXPECT_EQ(b.stats().tenants.size(), 1U);
    EXPECT_POOL_OK(b);
  }
  dead_tenant();
  EXPECT_TRUE(remove_stale_pool(path));
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace kvoffload::pool
