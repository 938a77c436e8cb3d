#include "tier/file/file_tier_recovery.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include <kvoffload/error.hpp>

#include "tier/file/file_record.hpp"

namespace kvoffload::detail {

namespace {

// Whether a temporary file's name (.<key hex>.<pid>-<n>.tmp) names a live writer's PID.
bool writer_alive(std::string_view name) {
  const std::size_t dot = name.find('.', 1);
  const std::size_t dash = name.find('-', dot == std::string_view::npos ? 0 : dot);
  if (dot == std::string_view::npos || dash == std::string_view::npos || dash == dot + 1) {
    return false;
  }
  long long pid = 0;
  for (const char c : name.substr(dot + 1, dash - dot - 1)) {
    if (c < '0' || c > '9' || pid > (1LL << 31)) return false;
    pid = pid * 10 + (c - '0');
  }
  return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM);
}

}  // namespace

std::string temp_name(const BlockKey& key, std::uint64_t id, bool shared) {
  std::string unique = std::to_string(id);
  if (shared) unique = std::to_string(::getpid()) + "-" + unique;
  return "." + key.to_hex() + "." + unique + kTempSuffix;
}

Recovery recover_root(const Syscalls& sys, const std::filesystem::path& root,
                      const std::string& tier_name, bool shared) {
  namespace fs = std::filesystem;
  struct Found {
    fs::file_time_type mtime;
    RecoveredRecord record;
  };
  std::vector<Found> found;
  Recovery out;
  std::error_code ec;
  for (const auto& sub : fs::directory_iterator(root, ec)) {
    std::error_code sec;
    if (!sub.is_directory(sec) || sub.is_symlink(sec)) continue;
    const auto dname = sub.path().filename().string();
    if (dname.size() != 2 || dname.find_first_not_of("0123456789abcdef") != std::string::npos) {
      continue;
    }
    for (const auto& f : fs::directory_iterator(sub.path(), sec)) {
      const auto fname = f.path().filename().string();
      std::error_code fec;
      if (!f.is_regular_file(fec)) continue;
      if (fname.starts_with(".") && fname.ends_with(kTempSuffix)) {
        if (!(shared && writer_alive(fname)) &&
            sys.unlinkat(sys.context, AT_FDCWD, f.path().c_str(), 0) == 0)
          ++out.stale_temps_removed;
        continue;
      }
      if (!fname.ends_with(kRecordSuffix)) continue;
      const auto stem =
          std::string_view(fname).substr(0, fname.size() - std::strlen(kRecordSuffix));
      if (stem.size() != BlockKey::kHexDigits) continue;
      const auto key = BlockKey::try_parse_hex(stem);
      if (!key || fan_dir_name(*key) != dname || stem != key->to_hex()) continue;
      const auto bytes = f.file_size(fec);
      if (fec || bytes < kRecordAlign || bytes % kRecordAlign != 0)
        continue;  // not a record we wrote
      found.push_back({f.last_write_time(fec), {*key, bytes}});
    }
    if (sec) {
      throw Error(
          ErrorCode::kSystem,
          "file tier '" + tier_name + "': scanning " + sub.path().string() + ": " + sec.message(),
          sec.value(), "readdir");
    }
  }
  if (ec) {
    throw Error(ErrorCode::kSystem,
                "file tier '" + tier_name + "': scanning " + root.string() + ": " + ec.message(),
                ec.value(), "readdir");
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  out.records.reserve(found.size());
  for (const auto& f : found) out.records.push_back(f.record);
  return out;
}

}  // namespace kvoffload::detail
