#include "region/ownership.hpp"

#include <kvoffload/error.hpp>

#include "region/header.hpp"
#include "region/region_internal.hpp"

namespace kvoffload::detail {

std::string why_not_ours(const Syscalls& sys, int fd, const struct stat& st,
                         const std::string& path) {
  try {
    check_owner_and_mode(st, path);
  } catch (const Error& e) {
    return e.what();
  }
  RegionHeader header{};
  try {
    if (!read_header(sys, fd, header, path)) {
      return "shorter than a region header; not a region file";
    }
  } catch (const Error& e) {
    return "cannot read its header: " + errno_name(e.sys_errno());
  }
  // Note [Old formats]: a region an older kvoffload left is ours too.
  if (old_format_version(header, static_cast<std::uint64_t>(st.st_size))) return {};
  return header_problem(header, static_cast<std::uint64_t>(st.st_size));
}

}  // namespace kvoffload::detail
