#pragma once
// Runs a test body on a real, small tmpfs: a forked child enters a private mount namespace and
// mounts a fresh tmpfs of the given size on a new empty directory, so a full filesystem can be
// tested without touching the machine's. Needs CAP_SYS_ADMIN; when the namespace or the mount
// cannot be made, the result carries the step and its errno so the test can skip with a reason:
//
//   const auto r = test::run_on_private_tmpfs("1m", [](const std::filesystem::path& mnt) {
//     ...; return 0;   // the child's exit code; an exception exits 100 (what() on stderr)
//   });
//   if (!r.skip_reason.empty()) GTEST_SKIP() << r.skip_reason;
//   EXPECT_EQ(r.exit_code, 0);
//
// The mount disappears with the child's namespace; the directory is removed by the parent.

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>

#include <kvoffload/error.hpp>

#include "test_env.hpp"

namespace kvoffload::test {

struct PrivateTmpfsResult {
  int exit_code = -1;  // the body's return value; -1 when the child did not exit normally
  int wait_status = 0;
  std::string skip_reason;  // set when the tmpfs could not be made (the body did not run)
};

inline PrivateTmpfsResult run_on_private_tmpfs(
    const std::string& size, const std::function<int(const std::filesystem::path&)>& body) {
  const TempDir dir("/tmp");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw std::system_error(errno, std::generic_category(), "pipe2");
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (pid == 0) {
    ::close(fds[0]);
    auto refuse = [&](const char* step) {
      const int err = errno;
      const std::string why = kvoffload::errno_text(std::string(step) + " failed", err) +
                              "; a private tmpfs needs CAP_SYS_ADMIN";
      (void)!::write(fds[1], why.data(), why.size());
      ::_exit(0);
    };
    if (::unshare(CLONE_NEWNS) != 0) refuse("unshare(CLONE_NEWNS)");
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      refuse("mount(MS_PRIVATE)");
    const std::string options = "size=" + size + ",mode=0700";
    if (::mount("tmpfs", dir.path().c_str(), "tmpfs", 0, options.c_str()) != 0)
      refuse("mount(tmpfs)");
    ::close(fds[1]);
    int code = 100;
    try {
      code = body(dir.path());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  ::close(fds[1]);
  PrivateTmpfsResult r;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.skip_reason.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  r.wait_status = wait_child(pid);
  if (WIFEXITED(r.wait_status)) r.exit_code = WEXITSTATUS(r.wait_status);
  return r;
}

}  // namespace kvoffload::test
