#!/usr/bin/env python3
"""Copies the kv_offload part of a vLLM source tree: what python/tests' vLLM tests import.

Usage: tools/vllm_src_view.py VLLM_TREE OUT_DIR

python/tests/vllm_real imports vLLM's kv_offload modules from a tree that has no vllm/__init__.py
(it stands in for the rest of vLLM). The engine trees (vLLM's files at one commit, with its whole
import chain) hold those files too; this copies exactly them, byte for byte, into OUT_DIR (emptied
first), so the backend's tests run against every supported commit from its engine tree. Copied,
not linked: vllm_real checks that vLLM's modules resolve inside the tree it was given.
"""
import shutil
import sys
from pathlib import Path

# The kv_offload part of vLLM: the offloading interface, CPU spec and tiering, the connector and
# its config, their tests and usage document.
PREFIXES = (
    "vllm/v1/kv_offload/",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/",
    "tests/v1/kv_offload/",
)
FILES = (
    "vllm/distributed/kv_transfer/kv_connector/v1/base.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/metrics.py",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
    "vllm/config/kv_transfer.py",
    "tests/v1/kv_connector/unit/test_offloading_connector.py",
    "docs/features/kv_offloading_usage.md",
    "LICENSE",
)


def wanted(rel: str) -> bool:
    return rel in FILES or rel.startswith(PREFIXES)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    tree, out = Path(argv[1]), Path(argv[2])
    if not (tree / "vllm" / "v1" / "kv_offload" / "base.py").is_file():
        print(f"vllm_src_view: {tree} is not a vLLM tree (no vllm/v1/kv_offload/base.py)", file=sys.stderr)
        return 1
    if out.exists():
        shutil.rmtree(out)
    n = 0
    for path in sorted(p for p in tree.rglob("*") if p.is_file()):
        rel = path.relative_to(tree).as_posix()
        if "__pycache__" in rel or not wanted(rel):
            continue
        dest = out / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
        n += 1
    missing = [f for f in FILES if not (out / f).is_file()]
    if missing:
        print(f"vllm_src_view: {tree} lacks {missing}", file=sys.stderr)
        return 1
    print(f"vllm_src_view: {n} files of {tree} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
