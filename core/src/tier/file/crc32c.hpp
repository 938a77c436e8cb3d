#pragma once
// CRC32C (Castagnoli), the checksum of file-tier records. Hardware (SSE4.2 crc32) where the CPU
// has it, a slice-by-8 table otherwise; both give the same value (tested against RFC 3720 vectors).

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvoffload::detail {

// Continues a CRC: crc32c(b, crc32c(a)) == crc32c(a ++ b). Start with 0.
[[nodiscard]] std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc = 0) noexcept;

// The portable implementation, exposed so a test can compare it with the hardware path.
[[nodiscard]] std::uint32_t crc32c_portable(std::span<const std::byte> data,
                                            std::uint32_t crc = 0) noexcept;

}  // namespace kvoffload::detail
