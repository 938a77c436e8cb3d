#pragma once
// Pieces of the region protocol shared by region.cpp (create/join/close) and listing.cpp
// (list/clean).

#include <sys/stat.h>

#include <string>

#include "kvoffload/syscalls.hpp"

namespace kvoffload::detail {

inline constexpr const char* kRegionPrefix = "kvoffload_";
inline constexpr const char* kRegionSuffix = ".region";

// Throws kInvalidArgument unless `id` is 1..128 of [A-Za-z0-9._-] and not "." or "..".
void validate_engine_id(const std::string& id);

// "kvoffload_<id>.region" -> "<id>", or "" when `name` is not a region file name.
std::string engine_id_from_file_name(const std::string& name);

// Refuses a file this user must not join or remove: not a regular file, another owner, or a mode
// wider than 0600. Throws Error(kPermission) naming the path, the value found and what is allowed.
void check_owner_and_mode(const struct stat& st, const std::string& path);

// Whether `name` in `dirfd` is still the file (dev, ino) we hold. ENOENT counts as "no".
// Throws Error(kSystem) for other fstatat failures.
bool path_names_inode(const Syscalls& sys, int dirfd, const std::string& name,
                      const struct stat& held);

// Opens a directory for *at() calls; refuses a missing or non-directory path with
// kInvalidArgument.
int open_shm_dir(const Syscalls& sys, const std::string& dir);

}  // namespace kvoffload::detail
