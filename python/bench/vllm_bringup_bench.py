#!/usr/bin/env python3
"""Time to the first stored job of a vLLM worker with a --pool byte pool, kvoffload_bringup
'background' against 'blocking' (issue 27), through vLLM's real offloading types (the tree at
KVOFFLOAD_VLLM_SRC, with python/tests' stand-ins for torch) on the host backend.

One run: KvoffloadSpec from vLLM's OffloadingConfig, then as vLLM's engine core starts: the
worker (get_worker: kvoffload.OffloadWorker underneath), then the scheduler's manager
(get_manager). From before get_worker, the clock runs until the first store job is back:
prepare_store is retried until it hands out a chunk (in background mode only chunks the rank has
brought up), the job is submitted and waited for, and its bytes are compared with the device's.
Then until the whole pool is up (bringup_status()['state'] == 'ready'). Runs alternate modes,
--repeat each; printed as JSON, with the medians.

Run (build first):
  tools/vllm-python.sh --tree ../shared/vllm-017e9f4448-engine \\
    python/bench/vllm_bringup_bench.py --pool 4G --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402

import test_vllm_worker as tvw  # noqa: E402  (vllm_real.require(): KVOFFLOAD_VLLM_SRC)
from kvoffload.vllm import KvoffloadSpec  # noqa: E402

PAGE = 64 * 1024  # one 64 KiB block per chunk: a 64 KiB slot, a 64 KiB row


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def one_run(mode: str, pool: int, piece: str | None, shm_dir: str) -> dict:
    kv = tvw.KvCaches(tvw.Device("host"), bpc=1, seed=1, tensors=[(PAGE, PAGE)],
                      groups=[[(0, PAGE)]])
    extra = {"kvoffload_bringup": mode}
    if piece:
        extra["kvoffload_bringup_piece"] = piece
    config = tvw.offloading_config(shm_dir, kv, chunks=pool // PAGE, eviction_policy="lru", **extra)
    spec = KvoffloadSpec(config)
    t0 = time.perf_counter()
    worker = spec.get_worker(kv.caches)
    manager = spec.get_manager()
    attempts = 0
    while (out := manager.prepare_store([tvw.make_offload_key(b"k" * 32, 0)], tvw.CTX)) is None:
        attempts += 1
        time.sleep(0.0005)
    gpu = tvw.GPULoadStoreSpec([3], group_sizes=[1], block_indices=[0])
    assert worker.submit_store(1, gpu, out.store_spec)
    worker.wait({1})
    (res,) = worker.get_finished()
    first = time.perf_counter() - t0
    assert res.success
    (chunk,) = out.store_spec.block_ids.tolist()
    got = np.asarray(worker._worker.slot(chunk))[:PAGE]
    assert (got == kv.images[0][3]).all(), "the stored bytes differ"
    del got
    while worker.bringup_status()["state"] == "running":
        time.sleep(0.005)
    status = worker.bringup_status()
    ready = time.perf_counter() - t0
    pieces = worker._worker.registration()["pieces"]
    manager.shutdown()
    worker.shutdown()
    return {"mode": mode, "first_store_seconds": first, "pool_ready_seconds": ready,
            "state": status["state"], "pieces": pieces, "prepare_store_retries": attempts}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pool", default="4G")
    ap.add_argument("--piece", default=None, help="kvoffload_bringup_piece (default: 1 GiB)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shm-dir", default="/dev/shm")
    args = ap.parse_args()
    pool = parse_size(args.pool)
    runs = []
    with tempfile.TemporaryDirectory(dir=args.shm_dir, prefix="kvo-bringup-bench-") as d:
        for i in range(args.repeat):
            order = ("background", "blocking") if i % 2 == 0 else ("blocking", "background")
            for mode in order:
                runs.append(one_run(mode, pool, args.piece, d))
                print(json.dumps(runs[-1]), file=sys.stderr)
    summary = {mode: {k: statistics.median(r[k] for r in runs if r["mode"] == mode)
                      for k in ("first_store_seconds", "pool_ready_seconds")}
               for mode in ("background", "blocking")}
    print(json.dumps({"pool_bytes": pool, "piece": args.piece, "runs": runs, "median": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
