#!/usr/bin/env python3
"""kvoffload's secondary tiers for vLLM's TieringOffloadingSpec, through vLLM's SecondaryTierManager
interface, side by side in one run with what they are measured against:

file  kvoffload's `file` tier (KvoffloadFileTier) against vLLM's own `fs` tier
      (FileSystemTierManager, its code from the vLLM tree of tools/vllm-python.sh), in the same
      directory (--dir), with the same block sizes (64 KiB to 4 MiB), the same n_read_threads /
      n_write_threads, the same jobs: --total bytes per size in jobs of --blocks-per-job blocks,
      all submitted at once as vLLM's tiering manager cascades a step's stores (submit_store) and
      promotions (submit_load), then get_finished_jobs() polled every millisecond until the last
      job is back. Store: fresh keys (vLLM's fs skips keys whose file exists); load: the same
      keys into other primary rows, every byte compared with what was stored.
remote kvoffload's `remote` tier (KvoffloadRemoteTier) on a redis-server the bench starts, the
      same jobs, against `redis-benchmark -t set,get -d <block> -c <connections> -P 8` on the same
      server (its requests/s x block bytes).

Throughput is payload bytes / wall seconds from the first submit to the last result (MiB = 2^20).
Each of --repeat repetitions runs both sides back to back, alternating which goes first, so load
on a shared machine falls on both; reported are the medians of MiB/s and of the per-repetition
ratios (each repetition's kvoffload figure over the reference's of the same repetition). vLLM's fs tier runs its pure-Python I/O path: its optional C extension
(vllm.fs_io_C) is compiled code that is not part of the vLLM source tree.

Run (build first; as root or with a writable --dir on a real disk):
  tools/vllm-python.sh python/bench/vllm_tiers_bench.py --dir /var/tmp/kvo-tier-bench
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np

SIZES = "64K,128K,256K,512K,1M,2M,4M"


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text[:-1] if text[-1:] in "KMG" else text) * mult


def label(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def spec_for(block: int):
    """What a secondary tier reads of its OffloadingSpec (vLLM's own config classes)."""
    from vllm.v1.kv_offload.base import OffloadingKVEventsConfig
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",)),),
        worker_kv_bytes_per_block=block, enable_kv_cache_events=False, extra_config={},
        engine_id="bench", model=OffloadingModelConfig(name=f"bench/{block}", dtype="bfloat16"),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
            is_parallelism_agnostic=False))
    return types.SimpleNamespace(
        config=config, blocks_per_chunk=1,
        kv_events_config=OffloadingKVEventsConfig(enable_kv_cache_events=False,
                                                  self_describing_kv_events=False))


class Primary:
    """A page-aligned primary KV buffer of 2 x blocks rows: stores read the first half, loads
    write the second, as vLLM's SharedOffloadRegion memoryview (num_blocks, row bytes)."""

    def __init__(self, blocks: int, block: int):
        self.blocks = blocks
        self._map = mmap.mmap(-1, 2 * blocks * block)
        self.rows = np.frombuffer(self._map, dtype=np.uint8).reshape(2 * blocks, block)
        rng = np.random.default_rng(block)
        self.rows[:blocks] = rng.integers(0, 256, size=(blocks, block), dtype=np.uint8)
        self.view = memoryview(self.rows)

    def release(self):
        self.view.release()
        self.view = self.rows = None
        self._map.close()


def run_jobs(tier, jobs, timeout=600.0) -> float:
    """Submits every job, polls until all are back; wall seconds. Raises on a failed job."""
    left = {j.job_id for j in jobs}
    t0 = time.perf_counter()
    submit = tier.submit_load if jobs[0].is_promotion else tier.submit_store
    for j in jobs:
        submit(j)
    while left:
        for r in tier.get_finished_jobs():
            if not r.success:
                raise RuntimeError(f"{type(tier).__name__}: job {r.job_id} failed")
            left.discard(r.job_id)
        if left:
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError(f"{type(tier).__name__}: jobs not back after {timeout} s")
            time.sleep(0.001)
    return time.perf_counter() - t0


def make_jobs(keys, first_block, per_job, promotion, job_base):
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.tiering.base import TransferJob

    ctx = ReqContext(req_id="bench")
    jobs = []
    for n, i in enumerate(range(0, len(keys), per_job)):
        chunk = keys[i:i + per_job]
        ids = np.arange(first_block + i, first_block + i + len(chunk), dtype=np.int64)
        jobs.append(TransferJob(job_id=job_base + n, keys=chunk, block_ids=ids,
                                is_promotion=promotion, req_context=ctx))
    return jobs


def keys_for(tag: str, n: int):
    import hashlib

    from vllm.v1.kv_offload.base import make_offload_key

    return [make_offload_key(hashlib.sha256(f"{tag}/{i}".encode()).digest(), 0) for i in range(n)]


def bench_pair(name, tier, primary, block, per_job, tag, job_base):
    """(store MiB/s, load MiB/s) of one round: fresh keys stored, then loaded and compared."""
    keys = keys_for(tag, primary.blocks)
    total = len(keys) * block
    store_s = run_jobs(tier, make_jobs(keys, 0, per_job, False, job_base))
    load_s = run_jobs(tier, make_jobs(keys, primary.blocks, per_job, True, job_base + 1_000_000))
    if not np.array_equal(primary.rows[:primary.blocks], primary.rows[primary.blocks:]):
        raise RuntimeError(f"{name}: loaded rows differ from the stored ones ({label(block)})")
    primary.rows[primary.blocks:] = 0
    return total / store_s / 2**20, total / load_s / 2**20


def summary(reps):
    """Medians of per-repetition (store, load) MiB/s."""
    return {"store": statistics.median(r[0] for r in reps),
            "load": statistics.median(r[1] for r in reps)}


def ratios(ours, theirs):
    """Per-repetition ratios (repetition i of ours over repetition i of the reference, run
    back to back) and their medians: the machine's load changes between repetitions, far less
    within one."""
    store = [a[0] / b[0] for a, b in zip(ours, theirs)]
    load = [a[1] / b[1] for a, b in zip(ours, theirs)]
    return {"store_ratio": statistics.median(store), "load_ratio": statistics.median(load),
            "store_ratios": store, "load_ratios": load}


def fmt(values):
    return "/".join(f"{v:.2f}" for v in values)


def file_bench(args, sizes):
    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

    from kvoffload.vllm import KvoffloadFileTier

    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    out = []
    for block in sizes:
        blocks = max(args.blocks_per_job * 2, args.total // block)
        primary = Primary(blocks, block)
        spec = spec_for(block)
        root = base / f"run-{os.getpid()}-{block}"
        root.mkdir()
        threads = {"n_read_threads": args.threads, "n_write_threads": args.threads}
        tiers = {
            "vllm_fs": FileSystemTierManager(spec, primary.view, "fs", root_dir=str(root),
                                             **threads),
            "kvoffload_file": KvoffloadFileTier(spec, primary.view, "file", root_dir=str(root),
                                                capacity_bytes=1 << 50, **threads),
        }
        reps = {name: [] for name in tiers}  # (store, load) MiB/s per repetition
        try:
            for rep in range(args.repeat):
                order = list(tiers) if rep % 2 == 0 else list(reversed(tiers))
                for name in order:
                    reps[name].append(bench_pair(name, tiers[name], primary, block,
                                                 args.blocks_per_job, f"{name}/{block}/{rep}",
                                                 rep * 10_000_000))
                    # Keep the disk use bounded: vLLM's round of files goes (kvoffload's tier
                    # keeps its records; the directory goes after the last round).
                    if name == "vllm_fs":
                        for d in root.glob("*_r0"):
                            shutil.rmtree(d, ignore_errors=True)
        finally:
            direct = tiers["kvoffload_file"].stats()["direct_io"]
            for t in tiers.values():
                t.shutdown()
            fs_direct = tiers["vllm_fs"]._use_o_direct
            primary.release()
            shutil.rmtree(root, ignore_errors=True)
        row = {"block": block, "blocks": blocks, "threads": args.threads,
               "vllm_fs": summary(reps["vllm_fs"]) | {"o_direct": fs_direct},
               "kvoffload_file": summary(reps["kvoffload_file"]) | {"o_direct": direct}}
        row |= ratios(reps["kvoffload_file"], reps["vllm_fs"])
        out.append(row)
        if not args.json:
            print(f"file  {label(block):>7}  store {row['kvoffload_file']['store']:8.1f} vs "
                  f"{row['vllm_fs']['store']:8.1f} MiB/s ({row['store_ratio']:.2f}x)   load "
                  f"{row['kvoffload_file']['load']:8.1f} vs {row['vllm_fs']['load']:8.1f} MiB/s "
                  f"({row['load_ratio']:.2f}x)   per-rep ratios store "
                  f"{fmt(row['store_ratios'])} load {fmt(row['load_ratios'])}", flush=True)
    return out


def redis_benchmark(server, block, n, connections) -> dict:
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port),
                          "-t", "set,get", "-d", str(block), "-c", str(connections), "-P", "8",
                          "-n", str(n), "--csv"], capture_output=True, text=True, check=True,
                         timeout=600).stdout
    rps = {}
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells and cells[0] in ("SET", "GET"):
            rps[cells[0]] = float(cells[1])
    return {"set": rps["SET"] * block / 2**20, "get": rps["GET"] * block / 2**20}


def remote_bench(args, sizes):
    from kvoffload.vllm import KvoffloadRemoteTier
    from store_servers import Server

    server = Server("redis")
    out = []
    try:
        for block in sizes:
            blocks = max(args.blocks_per_job * 2, args.total // block)
            primary = Primary(blocks, block)
            tier = KvoffloadRemoteTier(spec_for(block), primary.view, "remote", url=server.url,
                                       connections_per_node=args.connections,
                                       put_timeout_ms=60_000, get_timeout_ms=60_000)
            tier_reps, rb_reps = [], []
            try:
                for rep in range(args.repeat):
                    # Alternating which goes first, so load on a shared machine falls on both.
                    for first in ((True, False) if rep % 2 == 0 else (False, True)):
                        if first:
                            tier_reps.append(bench_pair("kvoffload_remote", tier, primary, block,
                                                        args.blocks_per_job,
                                                        f"remote/{block}/{rep}",
                                                        rep * 10_000_000))
                        else:
                            rb = redis_benchmark(server, block, blocks, args.connections)
                            rb_reps.append((rb["set"], rb["get"]))
                        server.command(b"FLUSHALL")
            finally:
                tier.shutdown()
                primary.release()
            row = {"block": block, "blocks": blocks, "connections": args.connections,
                   "kvoffload_remote": summary(tier_reps), "redis_benchmark": summary(rb_reps)}
            row |= ratios(tier_reps, rb_reps)
            out.append(row)
            if not args.json:
                t, r = row["kvoffload_remote"], row["redis_benchmark"]
                print(f"redis {label(block):>7}  store {t['store']:8.1f} vs SET "
                      f"{r['store']:8.1f} MiB/s ({row['store_ratio']:.2f}x)   load "
                      f"{t['load']:8.1f} vs GET {r['load']:8.1f} MiB/s "
                      f"({row['load_ratio']:.2f}x)   per-rep ratios store "
                      f"{fmt(row['store_ratios'])} load {fmt(row['load_ratios'])}", flush=True)
    finally:
        server.close()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/kvo-tier-bench",
                    help="directory for both file tiers (a real disk, not tmpfs)")
    ap.add_argument("--sizes", default=SIZES, help=f"block sizes (default {SIZES})")
    ap.add_argument("--total", type=parse_size, default=parse_size("128M"),
                    help="bytes per block size and direction (default 128M)")
    ap.add_argument("--blocks-per-job", type=int, default=8)
    ap.add_argument("--threads", type=int, default=16,
                    help="n_read_threads = n_write_threads for both file tiers (vLLM's default 16)")
    ap.add_argument("--connections", type=int, default=4,
                    help="remote: connections per node, and redis-benchmark's -c")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--only", choices=["file", "remote"], help="run one half")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import vllm_real

    tree = vllm_real.require()  # raises outside tools/vllm-python.sh (the vLLM harness)
    logging_quiet()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if not args.json:
        print(f"vLLM from {tree}; {label(args.total)} per size and direction, jobs of "
              f"{args.blocks_per_job} blocks, {args.repeat} interleaved repetitions; medians of MiB/s "
              "and of per-repetition ratios, kvoffload vs reference")
    result = {"config": vars(args), "vllm_tree": str(tree)}
    if args.only in (None, "file"):
        result["file"] = file_bench(args, sizes)
    if args.only in (None, "remote"):
        result["remote"] = remote_bench(args, sizes)
    if args.json:
        print(json.dumps(result, indent=1))


def logging_quiet():
    import logging

    logging.getLogger().setLevel(logging.ERROR)
    os.environ.setdefault("KVOFFLOAD_LOG_LEVEL", "error")
    os.environ.setdefault("PYTHONHASHSEED", "0")


if __name__ == "__main__":
    main()
