// The file tier's write path: a put batch's admission (eviction to fit, capacity checks) under the
// index lock, then on the I/O threads each record written to a temp file, synced as the policy
// says and renamed into place; after ENOSPC, the oldest records evicted and the write retried until
// it fits or nothing is left to evict (Note [Full disk]).
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tier/file/file_tier_impl.hpp"
#include "tier/file/file_tier_recovery.hpp"
#include "util/log.hpp"

namespace kvoffload {

using detail::ItemOutcome;

ItemOutcome FileTier::Impl::write_temp(std::span<const Piece> pieces,
                                       const detail::XattrHeader* header,
                                       const std::filesystem::path& temp,
                                       const std::filesystem::path& dir) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
  bool used_direct = false;
  int fd = dio.open_record(temp, flags, used_direct);
  if (fd < 0 && errno == ENOENT) {  // fan-out directory not made yet
    if (sys.mkdirat(sys.context, AT_FDCWD, dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ItemOutcome::failed("mkdir " + dir.string(), errno);
    }
    fd = dio.open_record(temp, flags, used_direct);
  }
  if (fd < 0) return ItemOutcome::failed("open " + temp.string(), errno);

  auto fail_with_temp = [&](ItemOutcome o) {
    if (fd >= 0) close_fd(fd, temp);
    unlink_quietly(temp);
    return o;
  };
  // Every piece in one pwritev: one request to the device per record.
  std::array<struct iovec, detail::DirectIo::kMaxPieces> iov{};
  std::size_t n = 0;
  for (const Piece& piece : pieces) {
    if (piece.bytes == 0) continue;
    if (n == iov.size()) return fail_with_temp(ItemOutcome::failed("write of a record", E2BIG));
    // pwritev only reads the memory an iovec names (its iov_base is not const for preadv's sake).
    iov[n++] = {const_cast<std::byte*>(piece.data), piece.bytes};
  }
  if (auto o = dio.write_all(fd, std::span(iov.data(), n), used_direct, temp))
    return fail_with_temp(std::move(*o));
  // Format 3: the header into the inode (Note [File tier record]); ENOSPC is a full disk.
  if (header != nullptr && sys.fsetxattr(sys.context, fd, detail::kHeaderXattr, header->data(),
                                         header->size(), 0) != 0) {
    return fail_with_temp(ItemOutcome::failed("fsetxattr " + temp.string(), errno));
  }
  if (options.fsync != FsyncPolicy::kNone && sys.fdatasync(sys.context, fd) != 0) {
    return fail_with_temp(ItemOutcome::failed("fdatasync " + temp.string(), errno));
  }
  const int closed_fd = std::exchange(fd, -1);
  if (sys.close(sys.context, closed_fd) != 0) {
    return fail_with_temp(ItemOutcome::failed("close " + temp.string(), errno));
  }
  return {};
}

std::string FileTier::Impl::no_room_left(std::size_t evicted, std::size_t rounds) {
  std::uint64_t in_flight_bytes = 0;
  {
    std::lock_guard lock(mutex);
    in_flight_bytes = index.used_bytes() - index.ready_bytes();
  }
  const std::optional<std::uint64_t> free = free_bytes();
  return "no record left to evict, after evicting " + std::to_string(evicted) + " records in " +
         std::to_string(rounds) + " rounds; the filesystem of " + root.string() +
         " is held by other files and by " + std::to_string(in_flight_bytes) +
         " bytes of this tier's writes in flight, " +
         (free ? std::to_string(*free) + " bytes free" : std::string("free space unknown"));
}

FileTier::Impl::EncodedPut FileTier::Impl::encode_put(detail::IoWorker& worker,
                                                      const TierPut& item) {
  const std::uint64_t rec = record_bytes(item.bytes.size());
  // The payload's whole blocks go from the caller's memory (no copy); the rest, if any, through a
  // small bounce buffer. Unaligned memory under O_DIRECT: the whole record through the bounce
  // buffer. A format 3 record of whole blocks has no rest: one write of the row itself.
  const detail::RecordSplit split = detail::record_split(format, item.bytes.size());
  EncodedPut out;
  std::uint32_t crc = 0;
  if (in_place(item.bytes.data(), split.prefix)) {
    std::byte* tail = split.tail == 0 ? nullptr : worker.bounce.reserve(split.tail);
    crc = detail::encode_record_tail(format, tail, item.key, item.bytes);
    out.pieces = {Piece{item.bytes.data(), split.prefix}, Piece{tail, split.tail}};
  } else {
    std::byte* buf = worker.bounce.reserve(rec);
    crc = detail::encode_record(format, buf, item.key, item.bytes);
    out.pieces = {Piece{buf, rec}, Piece{}};
  }
  out.header = detail::xattr_header(item.key, item.bytes.size(), crc);
  out.has_header = format == detail::RecordFormat::kXattr;
  return out;
}

ItemOutcome FileTier::Impl::write_making_room(const EncodedPut& record, const BlockKey& key,
                                              std::uint64_t rec, const std::filesystem::path& temp,
                                              const std::filesystem::path& dir) {
  const detail::XattrHeader* header = record.has_header ? &record.header : nullptr;
  ItemOutcome written = write_temp(record.pieces, header, temp, dir);
  // Note [Full disk]: the disk filled behind our capacity (another writer, the other I/O threads'
  // writes admitted against the same free space, the filesystem's own metadata): make room from
  // the oldest records and retry, round after round, until the record fits or nothing is left to
  // evict: each round evicts at least one record, and the loop ends when the write fits or the
  // tier holds no ready record.
  std::size_t evicted_total = 0;
  std::size_t rounds = 0;
  while (written.status == TierItemStatus::kFailed && written.err == ENOSPC) {
    const std::size_t evicted = make_room(key, rec);
    if (evicted == 0) {
      written.detail += " (" + no_room_left(evicted_total, rounds) + ")";
      break;
    }
    evicted_total += evicted;
    ++rounds;
    warnings.log(spdlog::level::info, "enospc retry",
                 "file tier '{}': {}; evicted the {} oldest records (round {}), retrying",
                 options.name, written.detail, evicted, rounds);
    written = write_temp(record.pieces, header, temp, dir);
  }
  return written;
}

ItemOutcome FileTier::Impl::publish(const BlockKey& key, std::uint64_t epoch,
                                    const std::filesystem::path& temp,
                                    const std::filesystem::path& final_path) {
  {
    std::lock_guard name(name_lock(key));
    bool still_wanted = false;
    {
      std::lock_guard lock(mutex);
      still_wanted = index.owned_by(key, epoch);
    }
    if (!still_wanted) {
      unlink_quietly(temp);
      return ItemOutcome{TierItemStatus::kFailed, ECANCELED, "removed while being stored", false};
    }
    if (sys.renameat(sys.context, AT_FDCWD, temp.c_str(), AT_FDCWD, final_path.c_str()) != 0) {
      const int e = errno;
      unlink_quietly(temp);
      return ItemOutcome::failed("rename " + temp.string() + " -> " + final_path.string(), e);
    }
    std::lock_guard lock(mutex);
    index.mark_ready(key, epoch);
  }
  if (options.fsync == FsyncPolicy::kFull) {
    const auto dir = final_path.parent_path();
    const int raw = detail::retry_eintr([&] {
      return sys.openat(sys.context, AT_FDCWD, dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    });
    if (raw < 0) return ItemOutcome::failed("open " + dir.string(), errno);
    detail::UniqueFd dfd(sys, raw);
    if (sys.fsync(sys.context, dfd.get()) != 0)
      return ItemOutcome::failed("fsync " + dir.string(), errno);
  }
  return {};
}

ItemOutcome FileTier::Impl::do_put(detail::IoWorker& worker, const TierPut& item,
                                   std::uint64_t epoch, std::uint64_t temp_id) {
  const std::uint64_t rec = record_bytes(item.bytes.size());
  const auto final_path = record_path(item.key);
  const auto dir = final_path.parent_path();
  // Note [Shared root]: another opener's record of the key is taken as stored; temporary names
  // carry the PID, so two openers never write one temporary file.
  if (options.shared) {
    if (const auto held = on_disk(item.key); held && *held == rec) {
      std::lock_guard lock(mutex);
      index.mark_ready(item.key, epoch);
      return {};
    }
  }
  const EncodedPut record = encode_put(worker, item);
  const auto temp = dir / detail::temp_name(item.key, temp_id, options.shared);
  ItemOutcome written = write_making_room(record, item.key, rec, temp, dir);
  if (written.status != TierItemStatus::kOk) return written;
  return publish(item.key, epoch, temp, final_path);
}

std::string FileTier::Impl::exceeds_capacity(std::uint64_t rec) const {
  return "record of " + std::to_string(rec) + " bytes exceeds capacity " +
         std::to_string(index.capacity()) +
         (index.capacity() < options.capacity_bytes
              ? " (configured " + std::to_string(options.capacity_bytes) +
                    ", capped by the free space of " + root.string() + ")"
              : std::string());
}

std::optional<FileTier::Impl::PutAnswer> FileTier::Impl::admit_locked(
    const TierPut& item, std::size_t i, std::vector<BlockKey>& evicted, std::uint64_t& epoch) {
  if (index.holds(item.key)) return PutAnswer{i, TierItemStatus::kOk, 0, "already stored"};
  const std::uint64_t rec = record_bytes(item.bytes.size());
  if (rec > index.capacity()) {
    ++counters.puts_failed;
    return PutAnswer{i, TierItemStatus::kFailed, ENOSPC, exceeds_capacity(rec)};
  }
  while (!index.fits(rec)) {
    const auto victim = index.oldest();
    if (!victim) break;
    index.erase(*victim);
    ++counters.evictions;
    evicted.push_back(*victim);
  }
  if (!index.fits(rec)) {
    ++counters.puts_failed;
    return PutAnswer{i, TierItemStatus::kFailed, ENOSPC, "capacity is held by writes in flight"};
  }
  epoch = index.reserve(item.key, rec);
  return std::nullopt;
}

void FileTier::Impl::finish_put(const TierPut& item, std::uint64_t epoch, const ItemOutcome& o) {
  if (o.status == TierItemStatus::kOk) {
    std::lock_guard guard(mutex);
    ++counters.puts_ok;
    return;
  }
  {
    std::lock_guard guard(mutex);
    index.erase(item.key, epoch);
    ++counters.puts_failed;
  }
  reclaim(item.key);
  if (o.err != ECANCELED) {  // a remove overtaking its put is not a failure to report
    warnings.warn("put " + (o.err != 0 ? errno_name(o.err) : std::string("error")),
                  "file tier '{}': put of {} failed: {}", options.name, item.key.to_hex(),
                  o.detail);
  }
}

detail::IoPool::Task FileTier::Impl::put_task(TierBatchPromise promise, const TierPut& item,
                                              std::size_t i, std::uint64_t epoch,
                                              std::uint64_t temp_id) {
  return [this, promise, item, i, epoch, temp_id](detail::IoWorker& w) mutable {
    ItemOutcome o;
    try {
      o = do_put(w, item, epoch, temp_id);
    } catch (const std::exception& ex) {  // bad_alloc of the bounce buffer, path errors
      o = {TierItemStatus::kFailed, 0, ex.what(), false};
    }
    finish_put(item, epoch, o);
    promise.set(i, o.status, o.err, std::move(o.detail));
    end_flight();
  };
}

void FileTier::Impl::submit_puts(const std::vector<BlockKey>& evicted,
                                 std::vector<detail::IoPool::Task> writes) {
  // The victims' files go first: on a full disk the writes need the space they free
  // (Note [Full disk]); queued after them, every write would meet ENOSPC and evict twice.
  std::vector<detail::IoPool::Task> tasks;
  tasks.reserve(evicted.size() + writes.size());
  for (const auto& victim : evicted) {
    tasks.emplace_back([this, victim](detail::IoWorker&) {
      reclaim(victim);
      end_flight();
    });
  }
  std::move(writes.begin(), writes.end(), std::back_inserter(tasks));
  begin_flight(tasks.size());
  pool->submit_many(std::move(tasks));
}

// A put batch in three phases: admission of every item under the index lock (evicting to fit the
// capacity, re-measured once per batch first: Note [Full disk]), the answers of items that need
// no I/O, then the victims' unlinks and the writes on the I/O threads.
TierBatch FileTier::put(std::span<const TierPut> items) {
  Impl& s = *impl_;
  std::vector<BlockKey> keys;
  keys.reserve(items.size());
  for (const auto& it : items) keys.push_back(it.key);
  TierBatchPromise promise(keys);

  std::vector<Impl::PutAnswer> answers;
  std::vector<BlockKey> evicted;
  std::vector<detail::IoPool::Task> writes;
  // Re-measured once per batch, before the index lock (a system call).
  const std::optional<std::uint64_t> free = items.empty() ? std::nullopt : s.free_bytes();
  std::optional<Impl::CapacityChange> capacity_change;
  {
    std::lock_guard lock(s.mutex);
    s.check_open_locked();
    if (free) capacity_change = s.set_capacity_locked(*free);
    for (std::size_t i = 0; i < items.size(); ++i) {
      std::uint64_t epoch = 0;
      if (auto answer = s.admit_locked(items[i], i, evicted, epoch)) {
        answers.push_back(std::move(*answer));
        continue;
      }
      writes.push_back(s.put_task(promise, items[i], i, epoch, s.next_temp++));
    }
  }
  s.log_capacity(capacity_change);
  for (auto& a : answers) {
    if (a.status == TierItemStatus::kFailed) {
      s.warnings.warn("put " + errno_name(a.err), "file tier '{}': put of {} failed: {}",
                      s.options.name, items[a.index].key.to_hex(), a.detail);
    }
    promise.set(a.index, a.status, a.err, std::move(a.detail));
  }
  s.submit_puts(evicted, std::move(writes));
  return promise.batch();
}

}  // namespace kvoffload
