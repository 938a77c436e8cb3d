// `kvoffload probe`: what this machine offers the region (docs/DESIGN.md §10.1): the shm dir and
// its space, the page size, MADV_POPULATE_WRITE support, the memory cgroup limit, NUMA nodes, and
// the device backends built into this library with their device counts. Operators run it first when
// a region does not fit; tests parse its JSON.
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include <kvoffload/device_runtime.hpp>
#include <kvoffload/platform.hpp>
#include <kvoffload/region.hpp>

#include "cli.hpp"
#include "shm_fs.hpp"

namespace kvoffload::cli {
namespace {

struct ProbeOptions {
  std::string shm_dir;
  bool json = false;
};

std::string join_ints(const std::vector<int>& values) {
  std::ostringstream out;
  for (std::size_t i = 0; i < values.size(); ++i) out << (i == 0 ? "" : ",") << values[i];
  return out.str();
}

int run_probe(const ProbeOptions& opts) {
  const std::filesystem::path shm_dir =
      opts.shm_dir.empty() ? default_shm_dir() : std::filesystem::path(opts.shm_dir);
  const platform::FsSpace space = platform::filesystem_space(shm_dir);
  const FsType fs_type = filesystem_type(shm_dir);
  const std::size_t page = platform::page_size();
  const bool populate_write = platform::madv_populate_write_supported();
  const std::optional<std::uint64_t> cgroup_limit = platform::memory_cgroup_limit();
  const std::optional<std::uint64_t> cgroup_available = platform::memory_cgroup_available();
  const std::vector<int> numa = platform::numa_nodes();
  const std::vector<BackendInfo> backends = list_backends();

  nlohmann::json out{
      {"shm_dir", shm_dir.string()},
      {"shm_free_bytes", space.free_bytes},
      {"shm_total_bytes", space.total_bytes},
      {"shm_filesystem", fs_type.name},
      {"shm_in_memory", fs_type.memory_backed},
      {"page_size", page},
      {"madv_populate_write", populate_write},
      {"cgroup_memory_limit", cgroup_limit ? nlohmann::json(*cgroup_limit) : nlohmann::json()},
      {"cgroup_memory_available",
       cgroup_available ? nlohmann::json(*cgroup_available) : nlohmann::json()},
      {"numa_nodes", numa},
  };
  out["backends"] = backends_json(backends);

  std::ostringstream text;
  text << "shm dir:              " << shm_dir.string() << "\n"
       << "shm free / total:     " << human_bytes(space.free_bytes) << " / "
       << human_bytes(space.total_bytes) << "\n"
       << "shm filesystem:       " << fs_type.name
       << (fs_type.memory_backed ? " (in memory)"
                                 : " (NOT in memory: region pages are written back to disk)")
       << "\n"
       << "page size:            " << page << " bytes\n"
       << "MADV_POPULATE_WRITE:  "
       << (populate_write ? "supported" : "not supported (populate falls back to a page touch)")
       << "\n"
       << "memory cgroup limit:  "
       << (cgroup_limit ? human_bytes(*cgroup_limit) : std::string("none")) << "\n";
  if (cgroup_available) {
    text << "memory cgroup avail:  " << human_bytes(*cgroup_available) << "\n";
  }
  text << "NUMA nodes:           " << (numa.empty() ? std::string("unknown") : join_ints(numa))
       << "\n";
  text << "backends:\n" << backends_text(backends);
  emit(opts.json, out, text.str());
  return kExitOk;
}

const CommandRegistrar kRegisterProbe("probe", [](CLI::App& top) {
  auto* app = top.add_subcommand("probe", "Show what this machine offers the shared host region");
  auto opts = std::make_shared<ProbeOptions>();
  app->add_option("--shm-dir", opts->shm_dir,
                  "Directory of the region files (default $KVOFFLOAD_SHM_DIR, else /dev/shm)")
      ->type_name("DIR");
  app->add_flag("--json", opts->json, "Print one JSON object");
  return Command{app, [opts] { return run_probe(*opts); }};
});

}  // namespace
}  // namespace kvoffload::cli
