# kvoffload.vllm without vLLM: the import fails with an ImportError that says what is missing.
# (Needs no vLLM tree: vLLM is made unimportable in a subprocess.)
import os
import subprocess
import sys

import pytest


# The package and each of its modules, under their present and earlier paths: every one goes
# through the package's check of vLLM first.
@pytest.mark.parametrize("module", ["kvoffload.vllm", "kvoffload.vllm.manager", "kvoffload.vllm.spec",
                                    "kvoffload.vllm_pool", "kvoffload.vllm_tiers"])
def test_import_without_vllm_raises_a_clear_import_error(module):
    code = (
        "import sys\n"
        "sys.modules['vllm'] = None  # as if vLLM were not installed, even where it is\n"
        "import kvoffload\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as e:\n"
        "    print('IMPORTERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True,
                         text=True, check=True)
    assert "IMPORTERROR kvoffload.vllm is the vLLM offloading backend and needs vLLM installed" in out.stdout


def test_vllm_compat_imports_without_vllm():
    # It names the supported commits and judges block-hash sharing for tools that run without
    # vLLM, which is why it stays outside the kvoffload.vllm package.
    code = ("import sys\nsys.modules['vllm'] = None\n"
            "from kvoffload.vllm_compat import SUPPORTED_VLLM_COMMITS\nprint(len(SUPPORTED_VLLM_COMMITS))\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True,
                         text=True, check=True)
    assert int(out.stdout) >= 2
