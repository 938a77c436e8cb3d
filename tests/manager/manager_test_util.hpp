#pragma once
// Helpers shared by the manager tests.
#include <functional>
#include <initializer_list>
#include <vector>

#include <kvoffload/error.hpp>
#include <kvoffload/manager.hpp>

namespace kvoffload::test {

inline BlockKey K(std::uint64_t n) {
  return BlockKey::from_u64(n);
}

inline std::vector<BlockKey> Ks(std::initializer_list<std::uint64_t> ns) {
  std::vector<BlockKey> v;
  for (auto n : ns) v.push_back(K(n));
  return v;
}

inline std::vector<BlockKey> copy(std::span<const BlockKey> s) {
  return {s.begin(), s.end()};
}

inline ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kOk;
}

inline std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// Stores keys (prepare + complete success) and returns the keys evicted on the way.
inline std::vector<BlockKey> store(Manager& m, const std::vector<BlockKey>& keys,
                                   const std::vector<BlockKey>& protected_keys = {}) {
  const StorePlan plan = m.prepare_store(keys, protected_keys);
  if (!plan.ok()) throw Error(ErrorCode::kCapacity, plan.describe());
  std::vector<BlockKey> evicted = copy(plan.evicted);
  const std::vector<BlockKey> stored = copy(plan.keys);
  m.complete_store(stored, true);
  return evicted;
}

inline Manager make(std::uint64_t chunks, PolicyKind policy, std::uint32_t threshold = 0,
                    std::uint64_t tracker = 0) {
  ManagerConfig c;
  c.num_chunks = chunks;
  c.policy = policy;
  c.store_threshold = threshold;
  c.threshold_tracker_capacity = tracker;
  return Manager(c);
}

}  // namespace kvoffload::test
