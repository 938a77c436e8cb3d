"""The vLLM guide's --kv-transfer-config (docs/VLLM.md), read the way a user copies it (the vLLM
tests build their configs from it, so the guide cannot drift from what works); the README's short
vLLM example must be the guide's first config, word for word."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "VLLM.md"
README = ROOT / "README.md"
_CONFIG = r"--kv-transfer-config '(\{.*?\})'"


def _guide_section() -> str:
    text = GUIDE.read_text()
    return text[text.index("# vLLM integration"):]


def readme_transfer_config() -> dict:
    match = re.search(_CONFIG, _guide_section(), re.S)
    assert match, "docs/VLLM.md has no --kv-transfer-config '...'"
    config = json.loads(match.group(1))
    readme = README.read_text()
    landing = re.search(_CONFIG, readme[readme.index("## Integrating an engine"):], re.S)
    assert landing, "the README's 'Integrating an engine' has no vLLM --kv-transfer-config '...'"
    assert json.loads(landing.group(1)) == config, \
        "the README's vLLM example differs from docs/VLLM.md's first --kv-transfer-config"
    return config


def readme_tier_config(tier_type: str) -> dict:
    """The vLLM guide's --kv-transfer-config for vLLM's TieringOffloadingSpec with kvoffload's
    secondary tier `tier_type` ("remote" or "file")."""
    for match in re.finditer(_CONFIG, _guide_section(), re.S):
        config = json.loads(match.group(1))
        tiers = config["kv_connector_extra_config"].get("secondary_tiers", [])
        if any(t.get("type") == tier_type for t in tiers):
            return config
    raise AssertionError(f"docs/VLLM.md has no --kv-transfer-config with a "
                         f"{tier_type!r} secondary tier")
