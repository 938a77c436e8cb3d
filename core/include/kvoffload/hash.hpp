#pragma once
// The non-cryptographic hashes of kvoffload, each defined once. Their values are part of the
// contract where they leave the process, so none of them may change:
//   hash_bytes_128  names a vLLM OffloadKey's BlockKey (the Python binding): the file tier's record
//                   names and the remote tier's keys are found again by it after a restart;
//   mix64           the `kvoffload run` KV pattern (written by one process, checked by another);
//   splitmix64      the `kvoffload run` workload's keys and the benches' keys;
//   hash_128_to_64  BlockKey::hash(), for in-process hash tables only.
// tests/key/hash_test.cpp pins each one to known values.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kvoffload {

// 2^64 / golden ratio: splitmix64's increment, and a multiplier that spreads small integers.
inline constexpr std::uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

// The one mixer all of them finish with: xor-shift, multiply, xor-shift, multiply, xor-shift, a
// bijection of 64-bit words whose avalanche depends on the constants (each use below names a
// published set). xorshift_multiply<...>(0) == 0.
template <int S1, std::uint64_t M1, int S2, std::uint64_t M2, int S3>
constexpr std::uint64_t xorshift_multiply(std::uint64_t x) noexcept {
  x ^= x >> S1;
  x *= M1;
  x ^= x >> S2;
  x *= M2;
  x ^= x >> S3;
  return x;
}

// splitmix64's output mix (Stafford's variant 13), full avalanche.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  return xorshift_multiply<30, 0xBF58476D1CE4E5B9ULL, 27, 0x94D049BB133111EBULL, 31>(x);
}

// One step of splitmix64 (Steele, Lea & Flood, OOPSLA 2014) from state x: mix64(x + gamma). As a
// hash of small integers, splitmix64(i) spreads 0, 1, 2, ... over all 64 bits.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  return mix64(x + kGoldenGamma);
}

// A 64-bit hash of a 128-bit value (hi, lo) for hash tables: a multiply folds hi into lo, then the
// mixer with 32-bit shifts (three multiplies in all; cheaper than one cache miss).
constexpr std::uint64_t hash_128_to_64(std::uint64_t hi, std::uint64_t lo) noexcept {
  return xorshift_multiply<32, 0xD6E8FEB86659FD93ULL, 32, 0xD6E8FEB86659FD93ULL, 32>(
      hi * kGoldenGamma ^ lo);
}

struct Hash128 {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
};

// MurmurHash3's 64-bit finaliser (fmix64).
constexpr std::uint64_t murmur3_fmix64(std::uint64_t k) noexcept {
  return xorshift_multiply<33, 0xff51afd7ed558ccdULL, 33, 0xc4ceb9fe1a85ec53ULL, 33>(k);
}

// 128-bit hash of `len` bytes: MurmurHash3_x64_128's block mixing and finalisation (little-endian
// blocks), with fixed starting words instead of a seed, the tail zero-padded into one last block
// and the length folded in. Fixed: no seed, no process state, so the same bytes give the same
// value in every process and after a restart. Engines' keys are themselves cryptographic hashes,
// so a 128-bit mix keeps distinct keys distinct (birthday bound ~n^2/2^129) at a few nanoseconds
// per 36-byte key.
inline Hash128 hash_bytes_128(const void* bytes, std::size_t len) noexcept {
  constexpr std::uint64_t c1 = 0x87c37b91114253d5ULL;
  constexpr std::uint64_t c2 = 0x4cf5ad432745937fULL;
  const auto* data = static_cast<const unsigned char*>(bytes);
  std::uint64_t h1 = kGoldenGamma;
  std::uint64_t h2 = 0xC2B2AE3D27D4EB4FULL;
  const auto mix = [&](std::uint64_t k1, std::uint64_t k2) {
    k1 *= c1;
    k1 = std::rotl(k1, 31);
    k1 *= c2;
    h1 ^= k1;
    h1 = std::rotl(h1, 27);
    h1 += h2;
    h1 = h1 * 5 + 0x52dce729;
    k2 *= c2;
    k2 = std::rotl(k2, 33);
    k2 *= c1;
    h2 ^= k2;
    h2 = std::rotl(h2, 31);
    h2 += h1;
    h2 = h2 * 5 + 0x38495ab5;
  };
  std::size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    std::uint64_t k1 = 0;
    std::uint64_t k2 = 0;
    std::memcpy(&k1, data + i, 8);
    std::memcpy(&k2, data + i + 8, 8);
    mix(k1, k2);
  }
  if (i < len) {
    unsigned char tail[16] = {};
    std::memcpy(tail, data + i, len - i);
    std::uint64_t k1 = 0;
    std::uint64_t k2 = 0;
    std::memcpy(&k1, tail, 8);
    std::memcpy(&k2, tail + 8, 8);
    mix(k1, k2);
  }
  h1 ^= len;
  h2 ^= len;
  h1 += h2;
  h2 += h1;
  h1 = murmur3_fmix64(h1);
  h2 = murmur3_fmix64(h2);
  h1 += h2;
  h2 += h1;
  return {h1, h2};
}

}  // namespace kvoffload
