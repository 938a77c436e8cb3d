// kvoffload::ErrorCode and to_string(ErrorCode): every code, written out by hand. The values are
// the C API's stable kvo_status numbers and the names appear in JSON output, so a renumbered,
// renamed, added or dropped code in error_codes.h fails here (and in capi_test.c and
// test_errors.py).
#include <cerrno>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include <kvoffload/error.hpp>

namespace {

using kvoffload::ErrorCode;

struct Expected {
  ErrorCode code;
  int value;
  std::string_view name;
};

constexpr Expected kCodes[] = {
    {ErrorCode::kOk, 0, "ok"},
    {ErrorCode::kInvalidArgument, 1, "invalid_argument"},
    {ErrorCode::kCapacity, 2, "capacity"},
    {ErrorCode::kSystem, 3, "system"},
    {ErrorCode::kTimeout, 4, "timeout"},
    {ErrorCode::kMismatch, 5, "mismatch"},
    {ErrorCode::kPermission, 6, "permission"},
    {ErrorCode::kNotAvailable, 7, "not_available"},
    {ErrorCode::kDevice, 8, "device"},
    {ErrorCode::kTransferFailed, 9, "transfer_failed"},
    {ErrorCode::kNotFound, 10, "not_found"},
    {ErrorCode::kState, 11, "state"},
    {ErrorCode::kInternal, 12, "internal"},
    {ErrorCode::kInUse, 13, "in_use"},
};

TEST(ErrorCodes, EveryCodeHasItsStableValueAndName) {
  ASSERT_EQ(std::size(kCodes), static_cast<std::size_t>(kvoffload::kErrorCodeCount));
  for (const Expected& e : kCodes) {
    EXPECT_EQ(static_cast<int>(e.code), e.value) << e.name;
    EXPECT_EQ(kvoffload::to_string(e.code), e.name) << e.value;
  }
}

TEST(ErrorCodes, ValuesOutsideTheListAreUnknown) {
  EXPECT_EQ(kvoffload::to_string(static_cast<ErrorCode>(kvoffload::kErrorCodeCount)), "unknown");
  EXPECT_EQ(kvoffload::to_string(static_cast<ErrorCode>(-1)), "unknown");
}

// Error is thrown inside libkvoffload.so and caught outside it: its type must be exported (hidden
// visibility would give the caller a different typeinfo, and the catch below would miss).
TEST(ErrorCodes, ErrorThrownInTheLibraryIsCaughtByType) {
  try {
    kvoffload::throw_system_error("fallocate", ENOSPC, "/dev/shm/x");
    FAIL() << "throw_system_error returned";
  } catch (const kvoffload::Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kSystem);
    EXPECT_EQ(e.sys_errno(), ENOSPC);
    EXPECT_EQ(e.call(), "fallocate");
    EXPECT_EQ(std::string(e.what()), "fallocate /dev/shm/x: No space left on device (ENOSPC)");
  }
}

}  // namespace
