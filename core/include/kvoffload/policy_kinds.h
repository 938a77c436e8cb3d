/* The one list of the eviction policy kinds, shared by C++ (kvoffload::PolicyKind, to_string,
 * parse_policy_kind, make_policy, make_vllm_policy and kPolicyKinds, eviction_policy.hpp), C
 * (kvo_policy, kvoffload.h, and what kvo_manager_create accepts) and the program (`simulate
 * --policy`), the way error_codes.h lists the error codes. Each entry is X(value, NAME, CamelName,
 * name):
 *   value      the stable number: the C API takes it, so never renumber or reuse one;
 *   NAME       the C enumerator KVO_POLICY_NAME;
 *   CamelName  the C++ enumerator PolicyKind::kCamelName;
 *   name       the lowercase name (parsed case-insensitively, printed, listed in messages), and
 *              the factories make_name_policy and make_vllm_name_policy (eviction_policy.hpp).
 * A new kind is one line here and its two policies; every message that lists the allowed kinds
 * follows. Plain C: kvoffload.h includes it. */
#ifndef KVOFFLOAD_POLICY_KINDS_H
#define KVOFFLOAD_POLICY_KINDS_H

/* clang-format off */
#define KVOFFLOAD_POLICY_KINDS(X) \
  X(0, LRU, Lru, lru)             \
  X(1, ARC, Arc, arc)
/* clang-format on */

#endif /* KVOFFLOAD_POLICY_KINDS_H */
