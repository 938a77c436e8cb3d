#include <condition_variable>
#include <mutex>
#include <utility>

#include <kvoffload/error.hpp>
#include <kvoffload/tier.hpp>

namespace kvoffload {
namespace detail {

struct TierBatchState {
  mutable std::mutex mutex;
  mutable std::condition_variable cv;
  std::vector<TierItemResult> results;
  std::vector<bool> done;
  std::size_t remaining = 0;
  std::chrono::steady_clock::time_point finished{};  // set with the last item
};

}  // namespace detail

std::string_view to_string(TierItemStatus status) noexcept {
  switch (status) {
    case TierItemStatus::kOk:
      return "ok";
    case TierItemStatus::kMiss:
      return "miss";
    case TierItemStatus::kFailed:
      return "failed";
  }
  return "unknown";
}

std::string_view to_string(TierPresence presence) noexcept {
  switch (presence) {
    case TierPresence::kAbsent:
      return "absent";
    case TierPresence::kPresent:
      return "present";
    case TierPresence::kPending:
      return "pending";
  }
  return "unknown";
}

void SecondaryTier::lookup(std::span<const BlockKey> keys, std::span<TierPresence> out) {
  if (out.size() < keys.size()) {
    throw_invalid("tier lookup: out holds " + std::to_string(out.size()) + " entries for " +
                  std::to_string(keys.size()) + " keys");
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out[i] = contains(keys[i]) ? TierPresence::kPresent : TierPresence::kAbsent;
  }
}

std::size_t TierBatch::size() const noexcept {
  return state_ ? state_->results.size() : 0;
}

bool TierBatch::ready() const noexcept {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  return state_->remaining == 0;
}

std::vector<TierItemResult> TierBatch::wait() const {
  if (!state_) return {};
  std::unique_lock lock(state_->mutex);
  state_->cv.wait(lock, [&] { return state_->remaining == 0; });
  return state_->results;
}

bool TierBatch::wait_for(std::chrono::milliseconds timeout) const {
  if (!state_) return true;
  std::unique_lock lock(state_->mutex);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->remaining == 0; });
}

std::optional<std::chrono::steady_clock::time_point> TierBatch::finished_at() const noexcept {
  if (!state_) return std::nullopt;
  std::lock_guard lock(state_->mutex);
  if (state_->remaining != 0 || state_->results.empty()) return std::nullopt;
  return state_->finished;
}

std::size_t TierBatch::ok_count() const {
  std::size_t n = 0;
  for (const auto& r : wait()) n += r.status == TierItemStatus::kOk ? 1 : 0;
  return n;
}

TierBatchPromise::TierBatchPromise(std::size_t n)
    : state_(std::make_shared<detail::TierBatchState>()) {
  state_->results.resize(n);
  state_->done.assign(n, false);
  state_->remaining = n;
}

TierBatchPromise::TierBatchPromise(std::span<const BlockKey> keys) : TierBatchPromise(keys.size()) {
  for (std::size_t i = 0; i < keys.size(); ++i) state_->results[i].key = keys[i];
}

void TierBatchPromise::set(std::size_t index, TierItemStatus status, int sys_errno,
                           std::string detail) {
  bool last = false;
  {
    std::lock_guard lock(state_->mutex);
    if (index >= state_->results.size() || state_->done[index]) {
      throw Error(ErrorCode::kInternal,
                  "tier batch item " + std::to_string(index) + " set twice or out of range");
    }
    auto& r = state_->results[index];
    r.status = status;
    r.sys_errno = sys_errno;
    r.detail = std::move(detail);
    state_->done[index] = true;
    last = --state_->remaining == 0;
    if (last) state_->finished = std::chrono::steady_clock::now();
  }
  if (last) state_->cv.notify_all();
}

void TierBatchPromise::set(std::size_t index, const BlockKey& key, TierItemStatus status,
                           int sys_errno, std::string detail) {
  {
    std::lock_guard lock(state_->mutex);
    if (index < state_->results.size()) state_->results[index].key = key;
  }
  set(index, status, sys_errno, std::move(detail));
}

}  // namespace kvoffload
