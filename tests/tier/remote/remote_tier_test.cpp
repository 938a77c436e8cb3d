// What one standalone redis-server stores and answers through RemoteTier: round trips (one value
// per rank slot), answers known without asking, rows and buffers of the wrong size, the replicated
// layout, incompatible geometry, corrupted and evicted values, and two engines sharing chunks
// through their tiered stores.
//
// The remote tier's suites run against real servers the tests start themselves (redis-server,
// memcached, a 3-master Redis Cluster) on ephemeral loopback ports, and against a scriptable fake
// RESP server for protocol faults: remote_tier_test.cpp (what one redis-server stores and answers),
// remote_connections_test.cpp (a node's connections, killed, restarted, frozen or unreachable),
// remote_faults_test.cpp, remote_cluster_test.cpp and remote_memcached_test.cpp; the shared kit is
// remote_tier_test_util.hpp.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <kvoffload/error.hpp>
#include <kvoffload/manager.hpp>
#include <kvoffload/region.hpp>
#include <kvoffload/tiered_store.hpp>

#include "remote_servers.hpp"
#include "remote_tier_test_util.hpp"
#include "test_env.hpp"

namespace kvoffload {
namespace {

using namespace std::chrono_literals;
using namespace kvoffload::test;
using ::testing::HasSubstr;

// ---- standalone Redis -------------------------------------------------------------------------

TEST(RemoteRedis, RoundTripOneValuePerRankSlotAndAsyncLookup) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto writer = RemoteTier::open(options(redis.url()));
  const auto keys = keys_from(1, 8);
  const auto put = put_rows(*writer, keys);
  ASSERT_EQ(count(put, TierItemStatus::kOk), keys.size()) << put[0].detail;
  EXPECT_EQ(writer->remote_stats().stored, keys.size());
  EXPECT_TRUE(writer->contains(keys[0]));  // its own puts are known present
  // One value per chunk key and rank slot, under the namespaced key, 64-byte header + slot bytes.
  EXPECT_EQ(redis.cli({"DBSIZE"}), std::to_string(keys.size() * kWorld));
  const std::string k0 = writer->store_key(keys[0], 1);
  EXPECT_EQ(k0, "kvo1:" + fmt::format("{:016x}", writer->options().geometry.fingerprint()) + ":" +
                    keys[0].to_hex() + ":1");
  EXPECT_EQ(redis.cli({"STRLEN", k0}), std::to_string(kSlot + 64));

  // Another engine (same geometry): not known locally, so the first answer is pending.
  auto reader = RemoteTier::open(options(redis.url()));
  EXPECT_FALSE(reader->contains(keys[0]));
  std::vector<TierPresence> first(keys.size());
  reader->lookup(keys, first);
  EXPECT_EQ(first[0], TierPresence::kPending);
  const auto presence = resolve(*reader, keys);
  for (const auto p : presence) EXPECT_EQ(p, TierPresence::kPresent);
  EXPECT_TRUE(reader->contains(keys[0]));
  const std::vector<BlockKey> unknown = keys_from(100, 2);
  for (const auto p : resolve(*reader, unknown)) EXPECT_EQ(p, TierPresence::kAbsent);

  const GetResult g = get_rows(*reader, keys);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(g.items[i].status, TierItemStatus::kOk) << g.items[i].detail;
    EXPECT_EQ(g.rows[i], row_of(keys[i], kSlot * kWorld));
  }
  const GetResult miss = get_rows(*reader, unknown);
  EXPECT_EQ(miss.items[0].status, TierItemStatus::kMiss);
  EXPECT_TRUE(all_sentinel(miss.rows[0]));
  const RemoteStats s = reader->remote_stats();
  EXPECT_EQ(s.loaded, keys.size());
  EXPECT_EQ(s.get_misses, 2u);
  EXPECT_EQ(s.lookup_present, keys.size());
  EXPECT_EQ(s.lookup_absent, 2u);
  EXPECT_EQ(s.corrupt, 0u);
  EXPECT_TRUE(reader->close());
  EXPECT_THROW(reader->lookup(keys, first), Error);
}

TEST(RemoteRedis, KnownAnswersFromMemoryAndNeverStartsACheck) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto writer = RemoteTier::open(options(redis.url()));
  const auto keys = keys_from(300, 3);
  ASSERT_EQ(count(put_rows(*writer, keys), TierItemStatus::kOk), keys.size());
  EXPECT_EQ(writer->known(keys[0]), TierPresence::kPresent);  // its own put

  auto reader = RemoteTier::open(options(redis.url()));
  const std::vector<BlockKey> asked = {keys[0], keys_from(900, 1)[0]};
  for (const auto& k : asked) EXPECT_FALSE(reader->known(k).has_value());
  EXPECT_EQ(reader->remote_stats().lookups, 0u);  // known() asked the store nothing
  std::vector<TierPresence> out(asked.size());
  reader->lookup(asked, out);  // one batch for both
  EXPECT_EQ(reader->remote_stats().lookups, asked.size());
  const auto settled = resolve(*reader, asked);
  EXPECT_EQ(settled[0], TierPresence::kPresent);
  EXPECT_EQ(settled[1], TierPresence::kAbsent);
  EXPECT_EQ(reader->known(asked[0]), TierPresence::kPresent);
  EXPECT_FALSE(reader->known(keys[1]).has_value());  // never asked
  EXPECT_EQ(reader->remote_stats().lookups, asked.size());
  reader->close();
  EXPECT_THROW((void)reader->known(asked[0]), Error);
}

// put() and get() share one submit path; its row-size check fails only the item it concerns.
// A full presence cache makes room from settled answers, never from the checks in flight: with
// room for 4 keys and 4 settled answers, two new keys are still asked and found. (Dropping the
// checks in flight instead leaves no room, and every new key would answer "absent" unasked.)
TEST(RemoteRedis, AFullPresenceCacheDropsSettledAnswersNotChecksInFlight) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto writer = RemoteTier::open(options(redis.url()));
  const auto keys = keys_from(700, 6);
  ASSERT_EQ(count(put_rows(*writer, keys), TierItemStatus::kOk), keys.size());

  RemoteTierOptions o = options(redis.url());
  o.presence_capacity = 4;
  o.lookup_timeout = 30s;  // every answer is the store's, however loaded the machine
  auto reader = RemoteTier::open(o);
  const std::vector<BlockKey> first(keys.begin(), keys.begin() + 4);
  for (const auto p : resolve(*reader, first)) EXPECT_EQ(p, TierPresence::kPresent);
  const std::vector<BlockKey> more(keys.begin() + 4, keys.end());
  std::vector<TierPresence> now(more.size());
  reader->lookup(more, now);
  EXPECT_EQ(now[0], TierPresence::kPending) << "asked, not refused for want of room";
  EXPECT_EQ(now[1], TierPresence::kPending);
  for (const auto p : resolve(*reader, more)) EXPECT_EQ(p, TierPresence::kPresent);
  EXPECT_EQ(reader->remote_stats().lookups, keys.size());
  EXPECT_EQ(reader->remote_stats().lookup_present, keys.size());
}

TEST(RemoteRedis, APutRowOfTheWrongSizeFailsOnlyItsItem) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto tier = RemoteTier::open(options(redis.url()));
  const auto keys = keys_from(400, 2);
  const std::vector<std::byte> good = row_of(keys[0], kSlot * kWorld);
  const std::vector<std::byte> short_row(kSlot * kWorld - 1, std::byte{1});
  const std::vector<TierPut> puts = {{keys[0], good}, {keys[1], short_row}};
  const auto put = tier->put(puts).wait();
  EXPECT_EQ(put[0].status, TierItemStatus::kOk) << put[0].detail;
  EXPECT_EQ(put[1].status, TierItemStatus::kFailed);
  EXPECT_THAT(put[1].detail, HasSubstr(fmt::format("row of {} bytes; expected {}",
                                                   kSlot * kWorld - 1, kSlot * kWorld)));
  EXPECT_EQ(tier->remote_stats().stored, 1u);
  EXPECT_EQ(tier->remote_stats().put_errors, 1u);
  EXPECT_EQ(redis.cli({"DBSIZE"}), std::to_string(kWorld));  // only the good row's values
}

TEST(RemoteRedis, AGetBufferOfTheWrongSizeFailsOnlyItsItemAndIsLeftAlone) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto tier = RemoteTier::open(options(redis.url()));
  const auto keys = keys_from(500, 2);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), keys.size());
  std::vector<std::byte> good(kSlot * kWorld, std::byte{0xEE});
  std::vector<std::byte> short_buffer(kSlot * kWorld - 1, std::byte{0xEE});
  const std::vector<TierGet> gets = {{keys[0], good}, {keys[1], short_buffer}};
  const auto got = tier->get(gets).wait();
  EXPECT_EQ(got[0].status, TierItemStatus::kOk) << got[0].detail;
  EXPECT_EQ(good, row_of(keys[0], kSlot * kWorld));
  EXPECT_EQ(got[1].status, TierItemStatus::kFailed);
  EXPECT_THAT(got[1].detail, HasSubstr(fmt::format("buffer of {} bytes; expected {}",
                                                   kSlot * kWorld - 1, kSlot * kWorld)));
  EXPECT_TRUE(all_sentinel(short_buffer));
  EXPECT_EQ(tier->remote_stats().loaded, 1u);
  EXPECT_EQ(tier->remote_stats().get_errors, 1u);
}

TEST(RemoteRedis, ReplicatedLayoutStoresOneValuePerChunk) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  RemoteTierOptions o = options(redis.url());
  o.geometry.replicated = true;
  o.geometry.world_size = 4;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 3);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 3u);
  EXPECT_EQ(redis.cli({"DBSIZE"}), "3");
  EXPECT_EQ(redis.cli({"EXISTS", tier->store_key(keys[0], 0)}), "1");
  EXPECT_EQ(tier->store_key(keys[0], 0).back(), 'r');
  const GetResult g = get_rows(*tier, keys);
  EXPECT_EQ(g.rows[2], row_of(keys[2], kSlot));
}

TEST(RemoteRedis, IncompatibleGeometryNeverReadsAnotherEnginesBytes) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto a = RemoteTier::open(options(redis.url()));
  RemoteTierOptions other = options(redis.url());
  other.geometry.dtype = "bf16";  // same sizes, another element type
  auto b = RemoteTier::open(other);
  const auto keys = keys_from(1, 2);
  ASSERT_EQ(count(put_rows(*a, keys), TierItemStatus::kOk), 2u);
  for (const auto p : resolve(*b, keys)) EXPECT_EQ(p, TierPresence::kAbsent);
  const GetResult g = get_rows(*b, keys);
  EXPECT_EQ(count(g.items, TierItemStatus::kMiss), 2u);
  EXPECT_TRUE(all_sentinel(g.rows[0]));
}

TEST(RemoteRedis, CorruptedValuesAreCountedMissesAndNeverData) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  auto tier = RemoteTier::open(options(redis.url()));
  const auto keys = keys_from(1, 5);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 5u);
  redis.cli({"SETRANGE", tier->store_key(keys[0], 1), "1000", "X"});  // payload byte
  redis.cli({"SETRANGE", tier->store_key(keys[1], 0), "8", "Z"});     // fingerprint in the header
  redis.cli({"SET", tier->store_key(keys[2], 0), "short"});           // truncated
  redis.cli({"APPEND", tier->store_key(keys[3], 1), "tail"});         // longer than the slot
  const GetResult g = get_rows(*tier, keys);
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(g.items[i].status, TierItemStatus::kMiss) << i;
    EXPECT_TRUE(all_sentinel(g.rows[i])) << "row " << i << " was written";
  }
  EXPECT_THAT(g.items[0].detail, HasSubstr("payload checksum mismatch"));
  EXPECT_THAT(g.items[1].detail, HasSubstr("header checksum mismatch"));
  EXPECT_THAT(g.items[2].detail, HasSubstr("shorter than a header"));
  EXPECT_THAT(g.items[3].detail, HasSubstr("payload length mismatch"));
  EXPECT_EQ(g.items[4].status, TierItemStatus::kOk);
  EXPECT_EQ(tier->remote_stats().corrupt, 4u);
  EXPECT_EQ(tier->remote_stats().loaded, 1u);
  EXPECT_FALSE(tier->contains(keys[0]));  // a corrupt key is no longer advertised
}

// Note [Gets into the destination]: with verify_in_destination a value's payload is received
// straight into its slot of the row, after its header verified. The same damage as above: the
// slot of a value rejected by its header, its length or its absence is untouched, the slot of a
// payload that fails its checksum holds the bytes received; the row is a miss either way, and the
// verified copies of the same row sit in their slots.
TEST(RemoteRedis, VerifyInDestinationLeavesASlotUntouchedUntilItsHeaderVerified) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  RemoteTierOptions o = options(redis.url());
  o.verify_in_destination = true;
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 6);
  ASSERT_EQ(count(put_rows(*tier, keys), TierItemStatus::kOk), 6u);
  redis.cli({"SETRANGE", tier->store_key(keys[0], 1), "1000", "X"});  // payload byte of copy 1
  redis.cli({"SETRANGE", tier->store_key(keys[1], 0), "8", "Z"});     // copy 0's header
  redis.cli({"SET", tier->store_key(keys[2], 0), "short"});           // copy 0 truncated
  redis.cli({"APPEND", tier->store_key(keys[3], 1), "tail"});         // copy 1 too long
  redis.cli({"DEL", tier->store_key(keys[4], 0)});                    // copy 0 absent
  const GetResult g = get_rows(*tier, keys);
  const auto part = [&](std::size_t row, std::uint32_t copy) {
    const auto begin = g.rows[row].begin() + static_cast<std::ptrdiff_t>(copy * kSlot);
    return std::vector<std::byte>(begin, begin + static_cast<std::ptrdiff_t>(kSlot));
  };
  const auto want = [&](std::size_t row, std::uint32_t copy) {
    const std::vector<std::byte> whole = row_of(keys[row], kSlot * kWorld);
    const auto begin = whole.begin() + static_cast<std::ptrdiff_t>(copy * kSlot);
    return std::vector<std::byte>(begin, begin + static_cast<std::ptrdiff_t>(kSlot));
  };
  for (std::size_t i = 0; i < 5; ++i) EXPECT_EQ(g.items[i].status, TierItemStatus::kMiss) << i;
  EXPECT_THAT(g.items[0].detail, HasSubstr("payload checksum mismatch"));
  EXPECT_THAT(g.items[1].detail, HasSubstr("header checksum mismatch"));
  EXPECT_THAT(g.items[2].detail, HasSubstr("shorter than a header"));
  EXPECT_THAT(g.items[3].detail, HasSubstr("payload length mismatch"));
  EXPECT_THAT(g.items[4].detail, HasSubstr("absent"));
  // Untouched: rejected by the header, the length, or absent.
  EXPECT_TRUE(all_sentinel(part(1, 0)));
  EXPECT_TRUE(all_sentinel(part(2, 0)));
  EXPECT_TRUE(all_sentinel(part(3, 1)));
  EXPECT_TRUE(all_sentinel(part(4, 0)));
  // Received into the slot, then rejected: the bytes the store held (one of them damaged).
  std::vector<std::byte> damaged = want(0, 1);
  damaged[1000 - 64] = std::byte{'X'};
  EXPECT_EQ(part(0, 1), damaged);
  // The other copies of those rows verified where they landed.
  EXPECT_EQ(part(0, 0), want(0, 0));
  EXPECT_EQ(part(1, 1), want(1, 1));
  EXPECT_EQ(part(4, 1), want(4, 1));
  ASSERT_EQ(g.items[5].status, TierItemStatus::kOk);
  EXPECT_EQ(g.rows[5], row_of(keys[5], kSlot * kWorld));
  EXPECT_EQ(tier->remote_stats().corrupt, 4u);
  EXPECT_EQ(tier->remote_stats().loaded, 1u);
  // A row read again after a miss: every slot rewritten with its verified value.
  std::vector<std::byte> again(kSlot * kWorld, std::byte{0xEE});
  const TierGet one[] = {{keys[5], again}};
  ASSERT_EQ(tier->get(one).wait().front().status, TierItemStatus::kOk);
  EXPECT_EQ(again, row_of(keys[5], kSlot * kWorld));
}

TEST(RemoteRedis, EvictionUnderMaxmemoryIsAMissNeverCorrupt) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis,
                      {"--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru"});
  RemoteTierOptions o = options(redis.url(), 32 * 1024);
  auto tier = RemoteTier::open(o);
  const auto keys = keys_from(1, 96);  // 96 x 2 x 32 KiB = 6 MiB into 2 MiB
  for (std::size_t i = 0; i < keys.size(); i += 8) {
    const std::vector<BlockKey> batch(keys.begin() + i, keys.begin() + i + 8);
    ASSERT_EQ(count(put_rows(*tier, batch), TierItemStatus::kOk), 8u);
  }
  const GetResult g = get_rows(*tier, keys);
  const std::size_t ok = count(g.items, TierItemStatus::kOk);
  const std::size_t miss = count(g.items, TierItemStatus::kMiss);
  EXPECT_EQ(ok + miss, keys.size());
  EXPECT_GT(miss, 0u) << "nothing was evicted";
  EXPECT_GT(ok, 0u);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (g.items[i].status == TierItemStatus::kOk) {
      EXPECT_EQ(g.rows[i], row_of(keys[i], o.geometry.slot_bytes * 2));
    }
  }
  const RemoteStats s = tier->remote_stats();
  EXPECT_EQ(s.get_misses, miss);
  EXPECT_EQ(s.corrupt, 0u);
}

TEST(RemoteRedis, TwoEnginesShareChunksThroughTheirTieredStores) {
  SKIP_WITHOUT("redis-server", "redis-cli");
  ServerProcess redis(ServerProcess::Kind::kRedis);
  test::TempDir shm;
  struct Engine {
    std::optional<Region> region;
    std::unique_ptr<Manager> manager;
    std::unique_ptr<RemoteTier> tier;
    std::unique_ptr<TieredStore> store;
  };
  auto engine = [&](const std::string& id) {
    Engine e;
    RegionOptions ro;
    ro.engine_id = id + "-" + std::to_string(::getpid());
    ro.shm_dir = shm.path();
    ro.layout = {.num_chunks = 8, .slot_bytes = kSlot, .world_size = kWorld};
    e.region.emplace(Region::create_or_join(ro));
    ManagerConfig mc;
    mc.num_chunks = 8;
    e.manager = std::make_unique<Manager>(mc);
    RemoteTierOptions o = options(redis.url());
    o.geometry.slot_stride =
        e.region->geometry().slot_stride();  // rows as the region lays them out
    e.tier = RemoteTier::open(o);
    e.store = std::make_unique<TieredStore>(*e.manager, PrimaryRows::of(*e.region),
                                            std::vector<SecondaryTier*>{e.tier.get()});
    return e;
  };
  Engine a = engine("remote-a");
  Engine b = engine("remote-b");
  const auto keys = keys_from(1, 4);
  const PrimaryRows rows_a = PrimaryRows::of(*a.region);
  const StorePlan plan = a.manager->prepare_store(keys);
  ASSERT_TRUE(plan.ok());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto bytes = row_of(plan.keys[i], rows_a.row_bytes);
    std::memcpy(rows_a.row(plan.slots[i]).data(), bytes.data(), bytes.size());
  }
  a.store->complete_store(keys, true);  // returns before the remote write (write-through)
  (void)a.store->drain();
  EXPECT_EQ(a.tier->remote_stats().stored, keys.size());

  // Engine b never stored them: pending first, then promotable, then promoted into its slots.
  std::vector<TierLocation> where(keys.size());
  TieredLookup found = b.store->lookup(keys, where);
  EXPECT_EQ(where[0], TierLocation::kSecondaryPending);
  EXPECT_EQ(found.pending, keys.size());
  EXPECT_EQ(found.available_prefix, 0u);
  for (int i = 0; i < 1000 && found.pending > 0; ++i) {
    std::this_thread::sleep_for(1ms);
    found = b.store->lookup(keys, where);
  }
  ASSERT_EQ(found.available_prefix, keys.size());
  EXPECT_EQ(where[0], TierLocation::kSecondary);
  const PromoteTicket ticket = b.store->promote(keys);
  ASSERT_NE(ticket.id, 0u);
  std::size_t promoted = 0;
  for (const auto& c : b.store->drain()) promoted += c.promoted.size();
  EXPECT_EQ(promoted, keys.size());
  const PrimaryRows rows_b = PrimaryRows::of(*b.region);
  for (const auto& k : keys) {
    const SlotIndex slot = b.manager->slot_of(k);
    ASSERT_NE(slot, kNoSlot);
    const auto want = row_of(k, rows_b.row_bytes);
    // Every rank's slot came back (the alignment padding between slots is not shared).
    const std::uint64_t stride = b.region->geometry().slot_stride();
    for (std::uint64_t c = 0; c < kWorld; ++c) {
      EXPECT_EQ(std::memcmp(rows_b.row(slot).data() + c * stride, want.data() + c * stride, kSlot),
                0)
          << c;
    }
  }
  EXPECT_EQ(b.tier->remote_stats().loaded, keys.size());
  for (Engine* e : {&b, &a}) {
    e->store.reset();
    e->tier->close();
    e->region->close();
  }
}

}  // namespace
}  // namespace kvoffload
