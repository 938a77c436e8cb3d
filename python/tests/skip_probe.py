# Run only by test_skip_policy.py, in a pytest of its own (the name keeps it out of the suite):
# KVO_PROBE_SKIP unset passes, "" skips without a reason tag, "tag" skips with that tag.
import os

import pytest


def test_does_what_it_is_told():
    tag = os.environ.get("KVO_PROBE_SKIP")
    if tag is None:
        return
    pytest.skip(f"[{tag}] the probe was told to skip" if tag else "a skip that names no reason")
