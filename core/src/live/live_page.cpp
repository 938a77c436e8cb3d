#include "live/live_page.hpp"

#include <algorithm>
#include <chrono>

namespace kvoffload {

LivePageSink::~LivePageSink() = default;

}  // namespace kvoffload

namespace kvoffload::detail {

void format_live_page(std::span<std::byte> area, std::uint32_t world_size) noexcept {
  LivePageHeader h{};
  std::memcpy(h.magic, kLiveMagic, sizeof h.magic);
  h.version = kLiveVersion;
  h.world_size = world_size;
  h.max_tiers = kLiveMaxTiers;
  h.rank_stride = sizeof(RankBlock);
  h.scheduler_offset = offsetof(LivePage, scheduler);
  h.tiers_offset = offsetof(LivePage, tiers);
  h.ranks_offset = sizeof(LivePage);
  h.bytes = live_bytes(world_size);
  std::memcpy(area.data(), &h, std::min(sizeof h, area.size()));
}

void put_tier_name(TierEntry& entry, std::string_view name) noexcept {
  char bytes[kLiveTierNameBytes] = {};
  std::memcpy(bytes, name.data(), std::min(name.size(), sizeof bytes - 1));
  for (std::size_t w = 0; w < std::size(entry.name_words); ++w) {
    std::uint64_t word = 0;
    std::memcpy(&word, bytes + w * 8, 8);
    LiveWrite::put(entry.name_words[w], word);
  }
}

std::string_view tier_name(const TierEntry& entry) noexcept {
  const auto* bytes = reinterpret_cast<const char*>(entry.name_words);
  return {bytes, strnlen(bytes, kLiveTierNameBytes - 1)};
}

std::uint64_t unix_now_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace kvoffload::detail
