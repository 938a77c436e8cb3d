# kvoffload.vllm without vLLM: the import fails with an ImportError that says what is missing.
# (Needs no vLLM tree: vLLM is made unimportable in a subprocess.)
import os
import subprocess
import sys


def test_import_without_vllm_raises_a_clear_import_error():
    code = (
        "import sys\n"
        "sys.modules['vllm'] = None  # as if vLLM were not installed, even where it is\n"
        "import kvoffload\n"
        "try:\n"
        "    import kvoffload.vllm\n"
        "except ImportError as e:\n"
        "    print('IMPORTERROR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True,
                         text=True, check=True)
    assert "IMPORTERROR kvoffload.vllm is the vLLM offloading backend and needs vLLM installed" in out.stdout
