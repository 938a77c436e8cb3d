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


def readme_tier_config(tier_type: str) -> dict:
    """The README's --kv-transfer-config for vLLM's TieringOffloadingSpec with kvoffload's
    secondary tier `tier_type` ("remote" or "file")."""
    text = README.read_text()
    section = text[text.index("## vLLM integration"):]
    for match in re.finditer(r"--kv-transfer-config '(\{.*?\})'", section, re.S):
        config = json.loads(match.group(1))
        tiers = config["kv_connector_extra_config"].get("secondary_tiers", [])
        if any(t.get("type") == tier_type for t in tiers):
            return config
    raise AssertionError(f"README's vLLM section has no --kv-transfer-config with a "
                         f"{tier_type!r} secondary tier")
