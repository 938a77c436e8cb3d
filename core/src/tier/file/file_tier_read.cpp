// The file tier's read path: a get batch (a miss for what the index does not hold ready), then on
// the read lane of the I/O threads each record read and verified (into the destination when it is
// aligned, else through the bounce buffer), a damaged record counted and dropped.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tier/file/file_tier_impl.hpp"

namespace kvoffload {

using detail::ItemOutcome;

ItemOutcome FileTier::Impl::do_get(detail::IoWorker& worker, const TierGet& item) {
  const auto path = record_path(item.key);
  bool used_direct = false;
  const int raw = dio.open_record(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, used_direct);
  if (raw < 0) {
    if (errno == ENOENT) {
      ItemOutcome gone = ItemOutcome::miss("record file missing", true);
      gone.err = ENOENT;  // not corrupt on a shared root (Note [Shared root]); cleared by get()
      return gone;
    }
    return ItemOutcome::failed("open " + path.string(), errno);
  }
  const detail::UniqueFd owned(sys, raw);  // closed on every way out (a read-only descriptor)
  const int fd = owned.get();

  detail::RecordFormat fmt = format;
  detail::XattrHeader xattr{};
  std::size_t xattr_bytes = 0;
  if (auto o = record_format_of(fd, path, fmt, xattr, xattr_bytes)) return std::move(*o);
  const std::span<const std::byte> header(xattr.data(), xattr_bytes);

  // No fstat per read (issue 31): a record shorter than expected ends the read early (a miss,
  // DirectIo::transfer: the read at the end of the file returns 0, also with O_DIRECT), one of
  // another length has no valid header for this length.
  const std::uint64_t rec = detail::record_bytes(fmt, item.into.size());
  const detail::RecordSplit split = detail::record_split(fmt, item.into.size());
  if (options.verify_in_destination && in_place(item.into.data(), split.prefix)) {
    // The payload's whole blocks straight into the destination, verified there; the rest (none
    // for a format 3 record of whole blocks) through the bounce buffer, in the same preadv: one
    // request to the device per record.
    std::byte* tail = split.tail == 0 ? nullptr : worker.bounce.reserve(split.tail);
    const std::array<struct iovec, 2> pieces{
        {{item.into.data(), split.prefix}, {tail, split.tail}}};
    if (auto o = dio.read_all(fd, pieces, used_direct, path)) return std::move(*o);
    const std::span<const std::byte> prefix(item.into.data(), split.prefix);
    if (auto why =
            detail::check_record_split(fmt, prefix, tail, item.key, item.into.size(), header)) {
      return ItemOutcome::miss(std::move(*why), true);
    }
    if (item.into.size() != split.prefix) {
      std::memcpy(item.into.data() + split.prefix, tail, item.into.size() - split.prefix);
    }
    return {};
  }
  std::byte* buf = worker.bounce.reserve(rec);
  const std::array<struct iovec, 1> whole{{{buf, rec}}};
  if (auto o = dio.read_all(fd, whole, used_direct, path)) return std::move(*o);
  if (auto why = detail::check_record(fmt, buf, item.key, item.into.size(), header)) {
    return ItemOutcome::miss(std::move(*why), true);
  }
  if (!item.into.empty()) std::memcpy(item.into.data(), buf, item.into.size());
  return {};
}

void FileTier::Impl::adopt_locked(const BlockKey& key, std::uint64_t file_bytes,
                                  std::vector<BlockKey>& evicted) {
  if (index.find(key) != nullptr) return;  // indexed meanwhile (a put, or another get)
  while (!index.fits(file_bytes)) {
    const auto victim = index.oldest();
    if (!victim) return;  // what is in flight holds the capacity: read, not indexed
    index.erase(*victim);
    ++counters.evictions;
    evicted.push_back(*victim);
  }
  index.add_ready(key, file_bytes);
}

std::optional<ItemOutcome> FileTier::Impl::record_format_of(int fd,
                                                            const std::filesystem::path& path,
                                                            detail::RecordFormat& fmt,
                                                            detail::XattrHeader& xattr,
                                                            std::size_t& xattr_bytes) {
  if (format == detail::RecordFormat::kTrailer) return std::nullopt;  // attributes refused
  const ssize_t got =
      sys.fgetxattr(sys.context, fd, detail::kHeaderXattr, xattr.data(), xattr.size());
  if (got >= 0) {
    fmt = detail::RecordFormat::kXattr;
    xattr_bytes = static_cast<std::size_t>(got);
    return std::nullopt;
  }
  switch (errno) {
    case ENODATA:     // no header attribute: a format 2 record (an earlier kvoffload's)
    case EOPNOTSUPP:  // on a filesystem that stopped keeping attributes
      fmt = detail::RecordFormat::kTrailer;
      return std::nullopt;
    case ERANGE:  // longer than any header
      return ItemOutcome::miss(
          "header attribute longer than " + std::to_string(detail::kXattrHeaderBytes) + " bytes",
          true);
    default:
      return ItemOutcome::failed("fgetxattr " + path.string(), errno);
  }
}

TierBatch FileTier::get(std::span<const TierGet> items) {
  Impl& s = *impl_;
  std::vector<BlockKey> keys;
  keys.reserve(items.size());
  for (const auto& it : items) keys.push_back(it.key);
  TierBatchPromise promise(keys);
  std::vector<std::size_t> absent;
  std::vector<detail::IoPool::Task> tasks;
  {
    std::lock_guard lock(s.mutex);
    s.check_open_locked();
    for (std::size_t i = 0; i < items.size(); ++i) {
      const TierGet& item = items[i];
      const detail::TierIndex::Entry* entry = s.index.find(item.key);
      // Note [Shared root]: a key not indexed may be another opener's record: read it.
      const bool adopt = entry == nullptr && s.options.shared;
      if (!adopt && (entry == nullptr || !entry->ready)) {
        ++s.counters.gets_miss;
        absent.push_back(i);
        continue;
      }
      const std::uint64_t epoch = adopt ? 0 : entry->epoch;
      tasks.push_back([&s, promise, item, i, epoch, adopt](detail::IoWorker& w) mutable {
        ItemOutcome o;
        try {
          o = s.do_get(w, item);
        } catch (const std::exception& ex) {
          o = {TierItemStatus::kFailed, 0, ex.what(), false};
        }
        bool drop = false;
        const bool gone = o.status == TierItemStatus::kMiss && o.err == ENOENT;
        if (gone) o.err = 0;
        std::vector<BlockKey> evicted;
        {
          std::lock_guard guard(s.mutex);
          switch (o.status) {
            case TierItemStatus::kOk: {
              ++s.counters.gets_ok;
              if (adopt) {
                s.adopt_locked(item.key, s.record_bytes(item.into.size()), evicted);
              } else {
                s.index.touch(item.key, epoch);  // most recently used
              }
              break;
            }
            case TierItemStatus::kMiss:
              ++s.counters.gets_miss;
              if (adopt) {
                drop = o.damaged && !gone;  // another opener's damaged record
                if (drop) ++s.counters.corrupt;
              } else if (o.damaged) {
                // A record another opener of a shared root evicted is not corrupt.
                if (!(gone && s.options.shared)) ++s.counters.corrupt;
                drop = s.index.erase(item.key, epoch);
              }
              break;
            case TierItemStatus::kFailed:
              ++s.counters.gets_failed;
              break;
          }
        }
        for (const BlockKey& victim : evicted) s.reclaim(victim);
        if (drop && !(gone && s.options.shared)) {
          s.warnings.warn("unusable record", "file tier '{}': record {} unusable ({}); dropped",
                          s.options.name, item.key.to_hex(), o.detail);
          s.reclaim(item.key);
        }
        promise.set(i, o.status, o.err, std::move(o.detail));
        s.end_flight();
      });
    }
  }
  for (std::size_t i : absent) promise.set(i, TierItemStatus::kMiss, 0, "not held");
  s.begin_flight(tasks.size());
  s.pool->submit_many(std::move(tasks), detail::IoLane::kRead);
  return promise.batch();
}

}  // namespace kvoffload
