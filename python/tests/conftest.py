import os
import sys

import pytest

# Run against the build tree by default: tools/test.sh sets PYTHONPATH=build/<preset>/python.
os.environ.setdefault("KVOFFLOAD_LOG_LEVEL", "warn")


@pytest.fixture
def shm_dir(tmp_path):
    """A private directory standing in for /dev/shm (regions are plain files on any tmpfs/fs)."""
    d = tmp_path / "shm"
    d.mkdir()
    return str(d)
