#pragma once
// FileTier: a SecondaryTier keeping one file per chunk row under a root directory.
//
// Layout: <root>/<hh>/<key hex>.kvb, hh = the first key byte in hex (256 fan-out directories,
// created on first use), plus <root>/.kvoffload-tier.lock, flock'ed exclusively by the one
// FileTier that owns the root (a second opener gets kState). A record is a 64-byte header (magic,
// version, key, payload length, CRC32C of the payload, CRC32C of the header) followed by the
// payload, zero-padded to 4 KiB so the same file can be written and read with O_DIRECT.
//
// Writes go to <root>/<hh>/.<key hex>.<n>.tmp and are renamed into place, so a reader never sees a
// half-written record under the real name. Temporary files of a previous owner are deleted when
// the root is opened; existing records are indexed (by name and size, no reads), oldest first.
//
// Fsync policy (FileTierOptions::fsync): the tier is a cache and every record carries checksums,
// so after a crash or power loss a record is either intact or detected as damaged and read as a
// miss. The default (kNone) therefore does not fsync; kData fdatasyncs each record before the
// rename (durable contents), kFull also fsyncs the directory after it (durable name).
//
// O_DIRECT (kAuto): records are written and read with O_DIRECT through aligned bounce buffers;
// when the filesystem refuses it (EINVAL at open, or at the first read/write), the tier logs once
// and continues buffered for good. kBuffered never tries.

#include <kvoffload/export.h>
#include <kvoffload/tier.hpp>

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

namespace kvoffload {

// The system calls the file tier makes, as a seam: tests derive from it to fail a chosen call
// with a chosen errno. POSIX conventions (-1 and errno). Implementations must be thread-safe:
// the tier calls them from its I/O threads.
class KVOFFLOAD_API FileTierIo {
 public:
  virtual ~FileTierIo() = default;
  virtual int open(const char* path, int flags, mode_t mode);
  virtual int close(int fd);
  virtual ssize_t pread(int fd, void* buf, std::size_t count, off_t offset);
  virtual ssize_t pwrite(int fd, const void* buf, std::size_t count, off_t offset);
  virtual int fdatasync(int fd);
  virtual int fsync(int fd);
  virtual int fstat(int fd, struct stat* st);
  virtual int fcntl_setfl(int fd, int flags);  // fcntl(fd, F_SETFL, flags)
  virtual int fcntl_getfl(int fd);             // fcntl(fd, F_GETFL)
  virtual int rename(const char* from, const char* to);
  virtual int unlink(const char* path);
  virtual int mkdir(const char* path, mode_t mode);
  virtual int flock(int fd, int operation);

  // The real system calls (a process-wide instance).
  static std::shared_ptr<FileTierIo> system();
};

enum class FsyncPolicy : std::uint8_t { kNone, kData, kFull };
enum class DirectIoMode : std::uint8_t { kAuto, kBuffered };

struct FileTierOptions {
  std::filesystem::path root;            // created (one level) when missing; parent must exist
  std::uint64_t capacity_bytes = 0;      // > 0: file bytes kept; the oldest records go beyond it
  unsigned io_threads = 4;               // 1..256
  DirectIoMode direct_io = DirectIoMode::kAuto;
  FsyncPolicy fsync = FsyncPolicy::kNone;
  std::string name = "file";             // for logs and stats
  std::shared_ptr<FileTierIo> io;        // nullptr: FileTierIo::system()
};

// Bytes a record of `payload_bytes` occupies on disk (header + payload, rounded to 4 KiB).
KVOFFLOAD_API std::uint64_t file_tier_record_bytes(std::uint64_t payload_bytes) noexcept;

class KVOFFLOAD_API FileTier final : public SecondaryTier {
 public:
  // Checks the options without touching anything but stat/access on the root and its parent:
  // empty or relative root, a root that is not a directory or not writable, a missing parent,
  // zero capacity, thread count out of range. Throws kInvalidArgument naming the value.
  static void validate(const FileTierOptions& options);

  // Validates, creates the root if needed, locks it, deletes stale temporary files, indexes the
  // records present and starts the I/O threads. Throws kvoffload::Error; leaves nothing open.
  static std::unique_ptr<FileTier> open(const FileTierOptions& options);

  ~FileTier() override;

  [[nodiscard]] const std::string& name() const noexcept override;
  TierBatch put(std::span<const TierPut> items) override;
  TierBatch get(std::span<const TierGet> items) override;
  [[nodiscard]] bool contains(const BlockKey& key) const override;
  TierBatch remove(std::span<const BlockKey> keys) override;
  void drain() override;
  [[nodiscard]] TierStats stats() const override;
  bool close() noexcept override;

  [[nodiscard]] const std::filesystem::path& root() const noexcept;
  // Where the record of `key` lives (whether or not it exists).
  [[nodiscard]] std::filesystem::path record_path(const BlockKey& key) const;

  struct Impl;

 private:
  explicit FileTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvoffload
