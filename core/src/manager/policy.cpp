// The policy kinds' names and factories, from the one list (policy_kinds.h).
#include <cctype>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/eviction_policy.hpp>

namespace kvoffload {

std::string_view to_string(PolicyKind kind) noexcept {
  for (const PolicyKindName& k : kPolicyKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

std::string policy_kind_names() {
  std::string out;
  const std::size_t n = std::size(kPolicyKinds);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += kPolicyKinds[i].name;
  }
  return out;
}

PolicyKind parse_policy_kind(std::string_view text) {
  std::string lower;
  for (const char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const PolicyKindName& k : kPolicyKinds) {
    if (lower == k.name) return k.kind;
  }
  throw_invalid("eviction policy '" + std::string(text) + "': unknown; expected " +
                policy_kind_names());
}

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, std::uint32_t capacity) {
  switch (kind) {
#define KVOFFLOAD_MAKE_POLICY_CASE_(value, upper, camel, name) \
  case PolicyKind::k##camel:                                   \
    return make_##name##_policy(capacity);
    KVOFFLOAD_POLICY_KINDS(KVOFFLOAD_MAKE_POLICY_CASE_)
#undef KVOFFLOAD_MAKE_POLICY_CASE_
  }
  throw_invalid("eviction policy " + std::to_string(static_cast<int>(kind)) + ": unknown");
}

}  // namespace kvoffload
