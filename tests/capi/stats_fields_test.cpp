// stats_fields.h lists every member of the C++ statistics structs, and C and Python see each
// listed field with the C++ value: the list is counted against the structs' members (an aggregate
// takes exactly as many initializers as it has members), and the C API's copies are checked
// field by field with a distinct value per field.
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/eviction_policy.hpp>
#include <kvoffload/manager.hpp>
#include <kvoffload/remote_tier.hpp>
#include <kvoffload/stats_fields.h>
#include <kvoffload/tier.hpp>
#include <kvoffload/transfer_engine.hpp>

#include "capi/capi_stats.hpp"

namespace kvoffload {
namespace {

// Converts to any member type; only named in unevaluated contexts.
struct AnyMember {
  template <typename T>
  operator T() const;  // NOLINT(google-explicit-constructor): that is its purpose
};

// How many members aggregate T has: the most initializers T{...} accepts.
template <typename T, typename... Init>
consteval std::size_t member_count() {
  if constexpr (requires { T{Init{}..., AnyMember{}}; }) {
    return member_count<T, Init..., AnyMember>();
  } else {
    return sizeof...(Init);
  }
}

TEST(StatsFields, ListEveryMemberOfTheCxxStructs) {
  EXPECT_EQ(member_count<EngineStats>(),
            std::size_t{KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_ENGINE_STATS_FIELDS)});
  // ManagerStats: the listed fields, the C++-only ones and `policy`.
  EXPECT_EQ(member_count<ManagerStats>(),
            std::size_t{KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_MANAGER_STATS_FIELDS) +
                        KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_MANAGER_STATS_CXX_ONLY_FIELDS) + 1});
  EXPECT_EQ(member_count<PolicyCounters>(),
            std::size_t{KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_POLICY_COUNTERS_FIELDS)});
  EXPECT_EQ(member_count<TierStats>(),
            std::size_t{KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_TIER_STATS_FIELDS)});
  EXPECT_EQ(member_count<RemoteStats>(),
            std::size_t{KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_REMOTE_STATS_FIELDS)});
}

TEST(StatsFields, CStructsAreTheListedFieldsAndNothingElse) {
  // Every member is 8 bytes (uint64_t, double) but the trailing int flag, padded to 8.
  EXPECT_EQ(sizeof(kvo_engine_stats),
            8 * std::size_t{KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_ENGINE_STATS_FIELDS)});
  EXPECT_EQ(sizeof(kvo_manager_stats),
            8 * std::size_t{KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_MANAGER_STATS_FIELDS) +
                            KVOFFLOAD_STATS_FIELD_COUNT(KVOFFLOAD_POLICY_COUNTERS_FIELDS)});
}

// A distinct value per field: the field's position (1, 2, ...), a half added for doubles; flags
// alternate, and are true for the first one.
// The C structs are ABI (kvo_*_stats carry no size field, callers allocate them): their layout
// is written out here by hand, as released. stats_fields.h generates the structs, so two entries
// swapped there would move members under the same library version with every generated copy still
// agreeing; this test is what notices. Append-only: a new field gets the next offset here.
TEST(StatsFields, TheCStructLayoutsAreTheReleasedOnes) {
  EXPECT_EQ(offsetof(kvo_engine_stats, jobs_submitted), 0U);
  EXPECT_EQ(offsetof(kvo_engine_stats, jobs_succeeded), 8U);
  EXPECT_EQ(offsetof(kvo_engine_stats, jobs_failed), 16U);
  EXPECT_EQ(offsetof(kvo_engine_stats, bytes_succeeded), 24U);
  EXPECT_EQ(offsetof(kvo_engine_stats, dma_batches), 32U);
  EXPECT_EQ(offsetof(kvo_engine_stats, kernel_batches), 40U);
  EXPECT_EQ(offsetof(kvo_engine_stats, fragments), 48U);
  EXPECT_EQ(offsetof(kvo_engine_stats, descriptors), 56U);
  EXPECT_EQ(offsetof(kvo_engine_stats, last_descriptors), 64U);
  EXPECT_EQ(offsetof(kvo_engine_stats, host_registered), 72U);
  EXPECT_EQ(offsetof(kvo_manager_stats, num_chunks), 0U);
  EXPECT_EQ(offsetof(kvo_manager_stats, used), 8U);
  EXPECT_EQ(offsetof(kvo_manager_stats, write_pending), 16U);
  EXPECT_EQ(offsetof(kvo_manager_stats, pinned), 24U);
  EXPECT_EQ(offsetof(kvo_manager_stats, evictable), 32U);
  EXPECT_EQ(offsetof(kvo_manager_stats, usage), 40U);
  EXPECT_EQ(offsetof(kvo_manager_stats, write_pending_fraction), 48U);
  EXPECT_EQ(offsetof(kvo_manager_stats, pinned_fraction), 56U);
  EXPECT_EQ(offsetof(kvo_manager_stats, lookup_keys), 64U);
  EXPECT_EQ(offsetof(kvo_manager_stats, hits), 72U);
  EXPECT_EQ(offsetof(kvo_manager_stats, hits_pending), 80U);
  EXPECT_EQ(offsetof(kvo_manager_stats, misses), 88U);
  EXPECT_EQ(offsetof(kvo_manager_stats, stores_prepared), 96U);
  EXPECT_EQ(offsetof(kvo_manager_stats, stores_completed), 104U);
  EXPECT_EQ(offsetof(kvo_manager_stats, stores_failed), 112U);
  EXPECT_EQ(offsetof(kvo_manager_stats, stores_skipped_threshold), 120U);
  EXPECT_EQ(offsetof(kvo_manager_stats, allocation_failures), 128U);
  EXPECT_EQ(offsetof(kvo_manager_stats, evictions), 136U);
  EXPECT_EQ(offsetof(kvo_manager_stats, loads_prepared), 144U);
  EXPECT_EQ(offsetof(kvo_manager_stats, loads_completed), 152U);
  EXPECT_EQ(offsetof(kvo_manager_stats, policy_resident), 160U);
  EXPECT_EQ(offsetof(kvo_manager_stats, policy_evictable), 168U);
  EXPECT_EQ(offsetof(kvo_manager_stats, policy_recent), 176U);
  EXPECT_EQ(offsetof(kvo_manager_stats, policy_frequent), 184U);
  EXPECT_EQ(offsetof(kvo_manager_stats, policy_ghost_recent), 192U);
  EXPECT_EQ(offsetof(kvo_manager_stats, policy_ghost_frequent), 200U);
  EXPECT_EQ(offsetof(kvo_manager_stats, policy_recent_target), 208U);
}

// The order of every list is also the order of the Python stats() dicts' keys, as released.
#define KVO_TEST_NAME_(kind, name) #name,
TEST(StatsFields, TheListsKeepTheirReleasedOrder) {
  EXPECT_EQ(
      (std::vector<std::string>{KVOFFLOAD_ENGINE_STATS_FIELDS(KVO_TEST_NAME_)}),
      (std::vector<std::string>{"jobs_submitted", "jobs_succeeded", "jobs_failed",
                                "bytes_succeeded", "dma_batches", "kernel_batches", "fragments",
                                "descriptors", "last_descriptors", "host_registered"}));
  EXPECT_EQ((std::vector<std::string>{KVOFFLOAD_MANAGER_STATS_FIELDS(KVO_TEST_NAME_)}),
            (std::vector<std::string>{"num_chunks",
                                      "used",
                                      "write_pending",
                                      "pinned",
                                      "evictable",
                                      "usage",
                                      "write_pending_fraction",
                                      "pinned_fraction",
                                      "lookup_keys",
                                      "hits",
                                      "hits_pending",
                                      "misses",
                                      "stores_prepared",
                                      "stores_completed",
                                      "stores_failed",
                                      "stores_skipped_threshold",
                                      "allocation_failures",
                                      "evictions",
                                      "loads_prepared",
                                      "loads_completed"}));
  EXPECT_EQ((std::vector<std::string>{KVOFFLOAD_POLICY_COUNTERS_FIELDS(KVO_TEST_NAME_)}),
            (std::vector<std::string>{"resident", "evictable", "recent", "frequent", "ghost_recent",
                                      "ghost_frequent", "recent_target"}));
  EXPECT_EQ((std::vector<std::string>{KVOFFLOAD_TIER_STATS_FIELDS(KVO_TEST_NAME_)}),
            (std::vector<std::string>{"entries", "bytes", "capacity_bytes", "puts_ok",
                                      "puts_failed", "gets_ok", "gets_miss", "gets_failed",
                                      "corrupt", "evictions", "in_flight", "direct_io"}));
  EXPECT_EQ(
      (std::vector<std::string>{KVOFFLOAD_REMOTE_STATS_FIELDS(KVO_TEST_NAME_)}),
      (std::vector<std::string>{"stored", "put_errors", "loaded", "get_misses", "corrupt",
                                "get_errors", "lookups", "lookup_present", "lookup_absent",
                                "lookup_timeouts", "lookup_errors", "redirects", "map_refreshes",
                                "tasks", "breaker_opens", "nodes", "nodes_open", "auth_failures"}));
}
#undef KVO_TEST_NAME_

#define KVO_TEST_FILL_(kind, name) s.name = fill_value<decltype(s.name)>(++n);
#define KVO_TEST_FILL_POLICY_(kind, name) s.policy.name = fill_value<decltype(s.policy.name)>(++n);
template <typename T>
T fill_value(int n) {
  if constexpr (std::is_same_v<T, bool>) {
    return n % 2 == 1;
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(n) + 0.5;
  } else {
    return static_cast<T>(n);
  }
}
#define KVO_TEST_EXPECT_C_(kind, name) \
  EXPECT_EQ(c.name, static_cast<KVOFFLOAD_STATS_C_TYPE_##kind>(s.name)) << #name;
#define KVO_TEST_EXPECT_C_POLICY_(kind, name) \
  EXPECT_EQ(c.policy_##name, static_cast<KVOFFLOAD_STATS_C_TYPE_##kind>(s.policy.name)) << #name;

TEST(StatsFields, TheCApiCopiesEveryFieldOfEngineStats) {
  EngineStats s;
  int n = 0;
  KVOFFLOAD_ENGINE_STATS_FIELDS(KVO_TEST_FILL_)
  const kvo_engine_stats c = capi::to_c(s);
  KVOFFLOAD_ENGINE_STATS_FIELDS(KVO_TEST_EXPECT_C_)
  EXPECT_EQ(c.jobs_submitted, 1u);
  EXPECT_EQ(c.host_registered, 0);  // the tenth field: even
}

TEST(StatsFields, TheCApiCopiesEveryFieldOfManagerStats) {
  ManagerStats s;
  int n = 0;
  KVOFFLOAD_MANAGER_STATS_FIELDS(KVO_TEST_FILL_)
  KVOFFLOAD_POLICY_COUNTERS_FIELDS(KVO_TEST_FILL_POLICY_)
  const kvo_manager_stats c = capi::to_c(s);
  KVOFFLOAD_MANAGER_STATS_FIELDS(KVO_TEST_EXPECT_C_)
  KVOFFLOAD_POLICY_COUNTERS_FIELDS(KVO_TEST_EXPECT_C_POLICY_)
  EXPECT_EQ(c.usage, 6.5);
  EXPECT_EQ(c.policy_recent_target, 27u);
}

}  // namespace
}  // namespace kvoffload
