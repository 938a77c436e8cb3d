// stats_fields.h lists every member of the C++ statistics structs, and C and Python see each
// listed field with the C++ value: the list is counted against the structs' members (an aggregate
// takes exactly as many initializers as it has members), and the C API's copies are checked
// field by field with a distinct value per field.
#include <cstddef>
#include <type_traits>

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
