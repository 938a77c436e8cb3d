"""kvoffload.ErrorCode and kvoffload.Error: every code, written out by hand. The values are the C
API's stable kvo_status numbers and the names are stable too, so a renumbered, renamed, added or
dropped code in core/include/kvoffload/error_codes.h fails here (and in error_tests, capi_test)."""

import pytest

import kvoffload

CODES = [
    ("OK", 0, "ok"),
    ("INVALID_ARGUMENT", 1, "invalid_argument"),
    ("CAPACITY", 2, "capacity"),
    ("SYSTEM", 3, "system"),
    ("TIMEOUT", 4, "timeout"),
    ("MISMATCH", 5, "mismatch"),
    ("PERMISSION", 6, "permission"),
    ("NOT_AVAILABLE", 7, "not_available"),
    ("DEVICE", 8, "device"),
    ("TRANSFER_FAILED", 9, "transfer_failed"),
    ("NOT_FOUND", 10, "not_found"),
    ("STATE", 11, "state"),
    ("INTERNAL", 12, "internal"),
    ("IN_USE", 13, "in_use"),
]


def test_the_enum_has_exactly_these_codes():
    assert {name: int(code) for name, code in kvoffload.ErrorCode.__members__.items()} == {
        name: value for name, value, _ in CODES
    }


@pytest.mark.parametrize("member,value,name", CODES)
def test_code_value_and_name(member, value, name):
    code = getattr(kvoffload.ErrorCode, member)
    assert int(code) == value
    assert kvoffload.ErrorCode(value) == code
    assert kvoffload.error_code_name(code) == name
    err = kvoffload.Error("message", code)
    assert err.code == code and err.code_name == name and str(err) == "message"
