#pragma once
// The kit of the monitor suites (region_list_test.cpp, top_test.cpp, exporter_test.cpp): the
// program spawned in its own process group (stdout to a file or a pipe), and ScriptedEngine, an
// engine's scheduler in a forked child that publishes a known state (5 keys stored, 2 pinned)
// and holds it until released.

#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include <kvoffload/manager.hpp>
#include <kvoffload/offload_stack.hpp>
#include <kvoffload/region.hpp>

#include "child_process.hpp"
#include "test_env.hpp"

namespace kvoffload::test {

inline std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The program in its own process group, stdout to a file in `dir` (or to a pipe, read with
// read_line), stderr to a file in `dir`.
inline std::unique_ptr<ChildProcess> spawn(const std::vector<std::string>& args,
                                           const std::filesystem::path& dir,
                                           bool pipe_stdout = false) {
  static int counter = 0;
  const std::string tag = std::to_string(counter++);
  ChildSpec spec;
  spec.args = args;
  spec.out_file = dir / ("out" + tag);
  spec.err_file = dir / ("err" + tag);
  spec.pipe_stdout = pipe_stdout;
  spec.own_process_group = true;
  return std::make_unique<ChildProcess>(spec);
}

// An engine's scheduler in a child process: an OffloadStack over a region of 8 chunks (2 ranks),
// which looks up 5 keys (misses), stores them, fails 2 more stores (one key looked up while in
// flight: a pending hit), looks up 3 of the 5 (hits) and pins 2 for a load, then holds until
// released: misses 5, hits 3, pending 1, stores prepared 7, completed 5, failed 2, used 5,
// pinned 2. With `tier_root`, a file tier named `tier_name` sits behind the region.
class ScriptedEngine {
 public:
  ScriptedEngine(const std::filesystem::path& shm_dir, std::string id,
                 const std::filesystem::path& tier_root = {}, const std::string& tier_name = "file")
      : id_(std::move(id)) {
    int ready[2];
    int hold[2];
    if (::pipe(ready) != 0 || ::pipe(hold) != 0) throw std::runtime_error("pipe");
    pid_ = fork_child([&] {
      ::close(ready[0]);
      ::close(hold[1]);
      kvoffload::StackConfig config;
      config.region.engine_id = id_;
      config.region.layout = {.num_chunks = 8, .slot_bytes = 4096, .world_size = 2};
      config.region.shm_dir = shm_dir;
      if (!tier_root.empty()) {
        config.file_tiers.push_back(
            {.root = tier_root, .capacity_bytes = 1 << 20, .name = tier_name});
      }
      auto stack = kvoffload::OffloadStack::build(config);
      kvoffload::Manager& m = stack->manager();
      std::vector<kvoffload::BlockKey> keys;
      for (std::uint64_t i = 0; i < 5; ++i) keys.emplace_back(i + 1, i * 3);
      (void)stack->store().lookup(keys);
      const kvoffload::StorePlan plan = m.prepare_store(keys);
      stack->store().complete_store(plan.keys, true);
      (void)stack->store().drain();
      // Two stores that fail, one of them looked up while in flight (a pending hit), then 3 hits:
      // every lookup result and store outcome is a different non-zero count.
      const std::vector<kvoffload::BlockKey> failing = {kvoffload::BlockKey(100, 1),
                                                        kvoffload::BlockKey(101, 2)};
      if (m.prepare_store(failing).keys.size() != 2) return 4;
      (void)m.lookup(std::span(failing).first(1));
      stack->store().complete_store(failing, false);
      (void)m.lookup(std::span(keys).first(3));
      (void)m.prepare_load(std::span(keys).first(2));
      char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) return 2;
      (void)::read(hold[0], &byte, 1);  // EOF: released
      m.complete_load(std::span(keys).first(2));
      return stack->close() ? 0 : 3;
    });
    ::close(ready[1]);
    ::close(hold[0]);
    hold_ = hold[1];
    char byte = 0;
    if (::read(ready[0], &byte, 1) != 1) ADD_FAILURE() << "the scripted engine did not start";
    ::close(ready[0]);
  }
  ~ScriptedEngine() { release(); }
  ScriptedEngine(const ScriptedEngine&) = delete;
  ScriptedEngine& operator=(const ScriptedEngine&) = delete;

  void release() {
    if (hold_ < 0) return;
    ::close(hold_);
    hold_ = -1;
    const int status = wait_child(pid_);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  [[nodiscard]] const std::string& id() const { return id_; }
  [[nodiscard]] pid_t pid() const { return pid_; }

 private:
  std::string id_;
  pid_t pid_ = -1;
  int hold_ = -1;
};

}  // namespace kvoffload::test
