/* The one list of the fields of each statistics struct, shared by C++ (the structs, declared with
 * their comments in transfer_engine.hpp, manager.hpp, eviction_policy.hpp, tier.hpp and
 * remote_tier.hpp), C (kvo_engine_stats and kvo_manager_stats in kvoffload.h are generated from
 * it, and the C API copies through it) and Python (every stats() dict iterates it), the way
 * error_codes.h lists the error codes. Each entry is X(KIND, name):
 *   KIND  U64 (uint64_t), F64 (double) or FLAG (C int 0/1, C++ bool, Python bool);
 *   name  the C++ member, the C member (policy counters: policy_<name>) and the Python key.
 * The order is the C struct's layout and the Python dict's order: never reorder or remove an entry
 * of a struct the C API returns (kvo_*_stats carry no size), append instead. A field added to a
 * C++ struct is added here too: tests/capi/stats_fields_test.cpp fails while a member of the C++
 * struct is not listed. Plain C: kvoffload.h includes it. */
#ifndef KVOFFLOAD_STATS_FIELDS_H
#define KVOFFLOAD_STATS_FIELDS_H

/* clang-format off */

/* kvoffload::EngineStats (kvo_engine_stats, TransferEngine.stats()). */
#define KVOFFLOAD_ENGINE_STATS_FIELDS(X) \
  X(U64, jobs_submitted)                 \
  X(U64, jobs_succeeded)                 \
  X(U64, jobs_failed)                    \
  X(U64, bytes_succeeded)                \
  X(U64, dma_batches)                    \
  X(U64, kernel_batches)                 \
  X(U64, fragments)                      \
  X(U64, descriptors)                    \
  X(U64, last_descriptors)               \
  X(FLAG, host_registered)

/* kvoffload::ManagerStats without its `policy` member (kvo_manager_stats, Manager.stats()). */
#define KVOFFLOAD_MANAGER_STATS_FIELDS(X) \
  X(U64, num_chunks)                      \
  X(U64, used)                            \
  X(U64, write_pending)                   \
  X(U64, pinned)                          \
  X(U64, evictable)                       \
  X(F64, usage)                           \
  X(F64, write_pending_fraction)          \
  X(F64, pinned_fraction)                 \
  X(U64, lookup_keys)                     \
  X(U64, hits)                            \
  X(U64, hits_pending)                    \
  X(U64, misses)                          \
  X(U64, stores_prepared)                 \
  X(U64, stores_completed)                \
  X(U64, stores_failed)                   \
  X(U64, stores_skipped_threshold)        \
  X(U64, allocation_failures)             \
  X(U64, evictions)                       \
  X(U64, loads_prepared)                  \
  X(U64, loads_completed)

/* Members of kvoffload::ManagerStats that C and Python do not see: ready_chunks came after
 * kvo_manager_stats, whose layout cannot grow (callers allocate it without a size field). */
#define KVOFFLOAD_MANAGER_STATS_CXX_ONLY_FIELDS(X) \
  X(U64, ready_chunks)

/* kvoffload::PolicyCounters, ManagerStats::policy (kvo_manager_stats' policy_* members after the
 * fields above, Manager.stats()["policy"]). */
#define KVOFFLOAD_POLICY_COUNTERS_FIELDS(X) \
  X(U64, resident)                          \
  X(U64, evictable)                         \
  X(U64, recent)                            \
  X(U64, frequent)                          \
  X(U64, ghost_recent)                      \
  X(U64, ghost_frequent)                    \
  X(U64, recent_target)

/* kvoffload::TierStats (a secondary tier's stats(): the vLLM tiers' VllmTierCore.stats()). */
#define KVOFFLOAD_TIER_STATS_FIELDS(X) \
  X(U64, entries)                      \
  X(U64, bytes)                        \
  X(U64, capacity_bytes)               \
  X(U64, puts_ok)                      \
  X(U64, puts_failed)                  \
  X(U64, gets_ok)                      \
  X(U64, gets_miss)                    \
  X(U64, gets_failed)                  \
  X(U64, corrupt)                      \
  X(U64, evictions)                    \
  X(U64, in_flight)                    \
  X(FLAG, direct_io)

/* kvoffload::RemoteStats (RemoteTier::remote_stats(), VllmTierCore.remote_stats()). */
#define KVOFFLOAD_REMOTE_STATS_FIELDS(X) \
  X(U64, stored)                         \
  X(U64, put_errors)                     \
  X(U64, loaded)                         \
  X(U64, get_misses)                     \
  X(U64, corrupt)                        \
  X(U64, get_errors)                     \
  X(U64, lookups)                        \
  X(U64, lookup_present)                 \
  X(U64, lookup_absent)                  \
  X(U64, lookup_timeouts)                \
  X(U64, lookup_errors)                  \
  X(U64, redirects)                      \
  X(U64, map_refreshes)                  \
  X(U64, tasks)                          \
  X(U64, breaker_opens)                  \
  X(U64, nodes)                          \
  X(U64, nodes_open)                     \
  X(U64, auth_failures)

/* clang-format on */

/* The C type of each KIND (kvoffload.h's structs, the C API's copies). */
#define KVOFFLOAD_STATS_C_TYPE_U64 uint64_t
#define KVOFFLOAD_STATS_C_TYPE_F64 double
#define KVOFFLOAD_STATS_C_TYPE_FLAG int

/* How many fields a list has: each entry expands to one "+1" term of the sum, so it cannot be
 * parenthesised. */
#define KVOFFLOAD_STATS_FIELD_ONE_(kind, name) +1 /* NOLINT(bugprone-macro-parentheses) */
#define KVOFFLOAD_STATS_FIELD_COUNT(list) (0 list(KVOFFLOAD_STATS_FIELD_ONE_))

#endif /* KVOFFLOAD_STATS_FIELDS_H */
