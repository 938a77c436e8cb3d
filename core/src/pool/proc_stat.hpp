#pragma once
// Liveness of a process from /proc/PID/stat: a PID alone is not an identity (it is recycled), a
// PID and its start time are (the node pool's tenants, Note [Pool repair] in pool_repair.cpp).

#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace kvoffload::pool::detail {

struct ProcStat {
  char state = '?';              // field 3: R, S, D, T (stopped), t (traced), Z (zombie), X ...
  std::uint64_t start_time = 0;  // field 22, clock ticks after boot
};

// nullopt when the process does not exist (or /proc/PID/stat cannot be read or parsed).
std::optional<ProcStat> read_proc_stat(pid_t pid) noexcept;

// Whether pid is the process that had start_time: it exists, has that start time and is neither
// a zombie nor dead (a SIGKILLed child its parent has not reaped yet is gone for us).
bool process_alive(pid_t pid, std::uint64_t start_time) noexcept;

}  // namespace kvoffload::pool::detail
