#include <cctype>
#include <string>

#include <kvoffload/error.hpp>
#include <kvoffload/eviction_policy.hpp>

namespace kvoffload {

std::string_view to_string(PolicyKind kind) noexcept {
  switch (kind) {
    case PolicyKind::kLru:
      return "lru";
    case PolicyKind::kArc:
      return "arc";
  }
  return "unknown";
}

PolicyKind parse_policy_kind(std::string_view text) {
  std::string lower;
  for (const char c : text) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "lru") return PolicyKind::kLru;
  if (lower == "arc") return PolicyKind::kArc;
  throw_invalid("eviction policy '" + std::string(text) + "': unknown; expected lru or arc");
}

std::unique_ptr<EvictionPolicy> make_policy(PolicyKind kind, std::uint32_t capacity) {
  switch (kind) {
    case PolicyKind::kLru:
      return make_lru_policy(capacity);
    case PolicyKind::kArc:
      return make_arc_policy(capacity);
  }
  throw_invalid("eviction policy " + std::to_string(static_cast<int>(kind)) + ": unknown");
}

}  // namespace kvoffload
