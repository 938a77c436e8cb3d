#!/usr/bin/env python3
"""Loads only, through vLLM's SecondaryTierManager interface, for one tier and one block size:
what a profiler (perf, strace -c) attached to this process sees of the path the engine waits on.

Stores --total bytes of fresh keys once (jobs of 8 blocks, as vllm_tiers_bench.py), then loads
them --rounds times into other primary rows; prints MiB/s and, per record loaded, the wall time,
the process's CPU time (every thread: the tier's I/O threads, the kernel's work for them, Python)
and the calling thread's CPU time (the submits and the polling loop: the Python crossing).

  tier  `file`: kvoffload's KvoffloadFileTier; `fs`: vLLM's FileSystemTierManager (its code from
        the vLLM tree of tools/vllm-python.sh), both in --dir with O_DIRECT and --threads read + write
        threads.

With --pause S it prints "stored; pid N" after the stores and sleeps S seconds before the loads, so
a profiler can attach for the loads alone:
  tools/vllm-python.sh python/bench/vllm_tier_loads.py file --block 1M --pause 1 &
  perf record -e cpu-clock -g -p <pid>        # or: strace -c -f -p <pid>
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import vllm_tiers_bench as bench  # noqa: E402  (the same jobs, keys and primary buffer)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tier", choices=["file", "fs"])
    ap.add_argument("--block", type=bench.parse_size, default=bench.parse_size("1M"))
    ap.add_argument("--total", type=bench.parse_size, default=bench.parse_size("64M"))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--dir", default="/var/tmp/kvo-tier-loads")
    ap.add_argument("--pause", type=float, default=0.0)
    args = ap.parse_args()

    import vllm_real

    vllm_real.require()
    bench.logging_quiet()
    blocks = max(16, args.total // args.block)
    primary = bench.Primary(blocks, args.block)
    spec = bench.spec_for(args.block)
    root = Path(args.dir) / f"{args.tier}-{os.getpid()}"
    root.mkdir(parents=True)
    threads = {"n_read_threads": args.threads, "n_write_threads": args.threads}
    if args.tier == "fs":
        from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

        tier = FileSystemTierManager(spec, primary.view, "fs", root_dir=str(root), **threads)
    else:
        from kvoffload.vllm import KvoffloadFileTier

        tier = KvoffloadFileTier(spec, primary.view, "file", root_dir=str(root),
                                 capacity_bytes=1 << 50, **threads)
    try:
        keys = bench.keys_for("loads", blocks)
        bench.run_jobs(tier, bench.make_jobs(keys, 0, 8, False, 0))
        if args.pause > 0:
            print(f"stored; pid {os.getpid()}", flush=True)
            time.sleep(args.pause)
        cpu0, main0, wall = time.process_time(), time.thread_time(), 0.0
        for r in range(args.rounds):
            wall += bench.run_jobs(tier, bench.make_jobs(keys, blocks, 8, True,
                                                         1_000_000 * (r + 1)))
        cpu, main = time.process_time() - cpu0, time.thread_time() - main0
        if not (primary.rows[:blocks] == primary.rows[blocks:]).all():
            raise RuntimeError(f"{args.tier}: loaded rows differ from the stored ones")
        n = args.rounds * blocks
        print(f"{args.tier} {bench.label(args.block)}: {n * args.block / wall / 2**20:.0f} MiB/s "
              f"load; per record {wall / n * 1e6:.1f} us wall, {cpu / n * 1e6:.1f} us CPU, "
              f"{main / n * 1e6:.1f} us CPU on the calling thread", flush=True)
    finally:
        tier.shutdown()
        primary.release()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
