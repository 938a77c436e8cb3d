#pragma once
// list_regions with a look inside each region: the live statistics reader
// (core/src/region/live_read.cpp) reads each region's page through the descriptor the listing
// opened (read-only, never locked: Note [Hostile entries], docs/DESIGN.md §3.7).

#include <sys/stat.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <vector>

#include <kvoffload/region.hpp>

#include "region/header.hpp"
#include "sys/syscalls.hpp"

namespace kvoffload::detail {

// Called for each region file whose header is ours and valid, while its descriptor is open:
// `index` is the entry's position in the returned vector.
using RegionInspector =
    std::function<void(std::size_t index, int fd, const struct stat& st, const RegionHeader& h)>;

std::vector<RegionInfo> list_regions_with(const std::filesystem::path& shm_dir, const Syscalls& sys,
                                          const RegionInspector& inspect);

}  // namespace kvoffload::detail
