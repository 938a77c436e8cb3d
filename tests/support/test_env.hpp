#pragma once
// The test kit shared by every suite (namespace kvoffload::test; `::testing` stays gtest's):
//   TempDir            a unique directory (under /dev/shm by default: tmpfs, like a real shm dir),
//                      removed with its contents at the end of the test
//   files_under(dir)   every file (not directory) below dir, relative paths, sorted
//   fd_snapshot()      open descriptors of this process with what they point to
//   maps_snapshot()    file-backed mappings of this process
//   is_mapped(p)       whether the page holding p is mapped in this process (mincore)
//   fork_child(fn)     runs fn in a child that _exits with fn's result (100 on an exception)
//   wait_child(pid)    the child's wait status
//   unique_id(prefix)  an engine id no other test (or test process) uses

#include <dirent.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

namespace kvoffload::test {

class TempDir {
 public:
  explicit TempDir(const std::filesystem::path& base = "/dev/shm") {
    std::string tmpl = (base / "kvoffload-test-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw std::system_error(errno, std::generic_category(), "mkdtemp " + tmpl);
    }
    path_ = tmpl;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  // Names of the entries in the directory, sorted.
  [[nodiscard]] std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

// Every file (not directory) below `dir`, relative paths, sorted.
inline std::set<std::string> files_under(const std::filesystem::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!e.is_directory()) out.insert(std::filesystem::relative(e.path(), dir).string());
  }
  return out;
}

// fd -> target of /proc/self/fd/N (the descriptor used to list the directory is left out).
inline std::map<int, std::string> fd_snapshot() {
  std::map<int, std::string> fds;
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return fds;
  const int own = ::dirfd(dir);
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    if (fd == own) continue;
    char target[4096];
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    fds[fd] = n >= 0 ? std::string(target, static_cast<std::size_t>(n)) : std::string("?");
  }
  ::closedir(dir);
  return fds;
}

// File-backed mappings ("start-end perms ... path"), sorted. Anonymous memory is left out: the
// allocator maps and unmaps it on its own, while a leaked region is always file-backed.
inline std::vector<std::string> maps_snapshot() {
  std::vector<std::string> maps;
  std::ifstream in("/proc/self/maps");
  for (std::string line; std::getline(in, line);) {
    const auto slash = line.find(" /");
    if (slash == std::string::npos) continue;
    maps.push_back(line.substr(0, line.find(' ')) + line.substr(slash));
  }
  std::sort(maps.begin(), maps.end());
  return maps;
}

// Whether the page holding `p` is mapped: mincore fails with ENOMEM on an unmapped range. A
// release-order test asks it when a registration is released, which must be before the unmap.
inline bool is_mapped(const void* p) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  void* start = reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) & ~(page - 1));
  unsigned char vec = 0;
  return ::mincore(start, 1, &vec) == 0;
}

inline pid_t fork_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (pid == 0) {
    int code = 100;
    try {
      code = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
    } catch (...) {
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

inline int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

inline std::string unique_id(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

}  // namespace kvoffload::test
