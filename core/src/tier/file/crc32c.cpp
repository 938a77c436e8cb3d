#include "tier/file/crc32c.hpp"

#include <array>
#include <bit>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace kvoffload::detail {
namespace {

constexpr std::uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

using Tables = std::array<std::array<std::uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (std::uint32_t i = 0; i < 256; ++i) {
    for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
  }
  return t;
}

constexpr Tables kTables = make_tables();

std::uint32_t portable_raw(const unsigned char* p, std::size_t n, std::uint32_t c) noexcept {
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    w ^= c;
    c = kTables[7][w & 0xFF] ^ kTables[6][(w >> 8) & 0xFF] ^ kTables[5][(w >> 16) & 0xFF] ^
        kTables[4][(w >> 24) & 0xFF] ^ kTables[3][(w >> 32) & 0xFF] ^ kTables[2][(w >> 40) & 0xFF] ^
        kTables[1][(w >> 48) & 0xFF] ^ kTables[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xFFu];
  return c;
}

#if defined(__x86_64__)
// Note [Three-way CRC32C]: the crc32 instruction has a throughput of one per cycle but a latency
// of three, so one chain of it over a buffer runs at a third of the instruction's rate (8 GB/s
// here, 131 us per 1 MiB record: a quarter of a file-tier load's CPU time). Three independent
// chains over three adjacent blocks keep it busy; their values are joined by CRC linearity,
//   raw(c, A ++ B) == shift(raw(c, A), |B|) ^ raw(0, B),
// where shift(x, n) appends n zero bytes to the register x: a GF(2) 32x32 matrix, applied with
// four 256-entry tables per block length (Mark Adler's crc32c construction). Big blocks for the
// bulk of a record, small ones for the rest, single chains for the last bytes.
constexpr std::size_t kLongBlock = 8192;
constexpr std::size_t kShortBlock = 256;

using Matrix = std::array<std::uint32_t, 32>;  // column n: the image of bit n

constexpr std::uint32_t times(const Matrix& m, std::uint32_t v) {
  std::uint32_t sum = 0;
  for (std::size_t n = 0; v != 0; ++n, v >>= 1) {
    if ((v & 1u) != 0) sum ^= m[n];
  }
  return sum;
}

constexpr Matrix square(const Matrix& m) {
  Matrix out{};
  for (std::size_t n = 0; n < 32; ++n) out[n] = times(m, m[n]);
  return out;
}

// The operator that appends `bytes` (a power of two) zero bytes to a raw CRC register.
constexpr Matrix zeros_operator(std::size_t bytes) {
  Matrix op{};  // one zero bit (reflected): bit 0 folds in the polynomial, the others shift down
  op[0] = kPoly;
  for (std::size_t n = 1; n < 32; ++n) op[n] = 1u << (n - 1);
  for (int i = 0; i < 3; ++i) op = square(op);  // 8 zero bits: one zero byte
  for (std::size_t b = bytes; b > 1; b >>= 1) op = square(op);
  return op;
}

using ShiftTables = std::array<std::array<std::uint32_t, 256>, 4>;

constexpr ShiftTables shift_tables(std::size_t bytes) {
  const Matrix op = zeros_operator(bytes);
  ShiftTables t{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    for (std::size_t k = 0; k < 4; ++k) t[k][n] = times(op, n << (8 * k));
  }
  return t;
}

constexpr ShiftTables kShiftLong = shift_tables(kLongBlock);
constexpr ShiftTables kShiftShort = shift_tables(kShortBlock);

constexpr std::uint32_t shift(const ShiftTables& t, std::uint32_t c) {
  return t[0][c & 0xFFu] ^ t[1][(c >> 8) & 0xFFu] ^ t[2][(c >> 16) & 0xFFu] ^ t[3][c >> 24];
}

// Three chains over the three blocks of `block` bytes at p, joined into c (the raw register).
__attribute__((target("sse4.2"))) inline std::uint64_t three_way(const unsigned char* p,
                                                                 std::size_t block,
                                                                 const ShiftTables& t,
                                                                 std::uint64_t c) noexcept {
  std::uint64_t c1 = 0;
  std::uint64_t c2 = 0;
  for (std::size_t i = 0; i < block; i += 8) {
    std::uint64_t w0;
    std::uint64_t w1;
    std::uint64_t w2;
    std::memcpy(&w0, p + i, 8);
    std::memcpy(&w1, p + block + i, 8);
    std::memcpy(&w2, p + 2 * block + i, 8);
    c = _mm_crc32_u64(c, w0);
    c1 = _mm_crc32_u64(c1, w1);
    c2 = _mm_crc32_u64(c2, w2);
  }
  c = shift(t, static_cast<std::uint32_t>(c)) ^ c1;
  return shift(t, static_cast<std::uint32_t>(c)) ^ c2;
}

__attribute__((target("sse4.2"))) std::uint32_t hardware_raw(const unsigned char* p, std::size_t n,
                                                             std::uint32_t c) noexcept {
  std::uint64_t c64 = c;
  while (n >= 3 * kLongBlock) {
    c64 = three_way(p, kLongBlock, kShiftLong, c64);
    p += 3 * kLongBlock;
    n -= 3 * kLongBlock;
  }
  while (n >= 3 * kShortBlock) {
    c64 = three_way(p, kShortBlock, kShiftShort, c64);
    p += 3 * kShortBlock;
    n -= 3 * kShortBlock;
  }
  while (n >= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<std::uint32_t>(c64);
  while (n-- > 0) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool have_sse42() noexcept {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

std::uint32_t crc32c_portable(std::span<const std::byte> data, std::uint32_t crc) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  return ~portable_raw(p, data.size(), ~crc);
}

std::uint32_t crc32c(std::span<const std::byte> data, std::uint32_t crc) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
#if defined(__x86_64__)
  if (have_sse42()) return ~hardware_raw(p, data.size(), ~crc);
#endif
  return ~portable_raw(p, data.size(), ~crc);
}

}  // namespace kvoffload::detail
