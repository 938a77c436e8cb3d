"""The README's vLLM --kv-transfer-config, read the way a user copies it (the vLLM tests build
their configs from it, so the README cannot drift from what works)."""

import json
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_transfer_config() -> dict:
    text = README.read_text()
    section = text[text.index("## vLLM integration"):]
    match = re.search(r"--kv-transfer-config '(\{.*?\})'", section, re.S)
    assert match, "README's vLLM section has no --kv-transfer-config '...'"
    return json.loads(match.group(1))
