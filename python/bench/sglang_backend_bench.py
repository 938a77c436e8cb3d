#!/usr/bin/env python3
"""kvoffload.sglang.KvoffloadStorage through SGLang's own HiCacheController storage paths (backup
= _page_backup, load = _storage_hit_query + _page_transfer, the code from the SGLang tree at
KVOFFLOAD_SGLANG_SRC) over SGLang's real MHA host pool (page_first, bf16, 64-token pages, CPU
tensors), side by side in one run with what it is measured against:

remote  the "remote" backend (zero-copy v1) on a redis-server the bench starts, pages of 1, 2, 4
        and 8 MiB, against `redis-benchmark -t set,get -d <page bytes> -c <connections> -P 8`
        on the same server (its requests/s x page bytes).
file    the "file" backend (zero-copy v1) against SGLang's built-in HiCacheFile (its legacy copy
        path, as SGLang's controller drives it: get_data_page / set_from_flat_data_page) in the
        same directory (--dir), the same pages and the same calls.
pool    the "pool" backend (kvoffload's node pool in /dev/shm, zero-copy v1; a pool of --pages
        chunks, mapped by a first backup of other pages unless --fresh-pool) against the
        "remote" backend on a local redis-server the bench starts (the local-Redis path an
        instance would otherwise share pages through), the same pages and calls.

Throughput is page bytes / wall seconds of one backup or one load of --pages pages (MiB = 2^20),
best of --repeat, the two sides alternating so load on a shared machine falls on both. Loads
follow the backup of the same pages (the page cache is warm for both file backends). Every load
is checked byte for byte against what was backed up.

Run (build first):
  KVOFFLOAD_SGLANG_SRC=../shared/sglang-17313cf4b2 PYTHONPATH=build/cpu/python \\
    /usr/bin/python3 python/bench/sglang_backend_bench.py --dir /var/tmp/kvo-sglang-bench
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests_sglang"))
sys.path.insert(0, str(HERE.parent / "tests"))

import sglang_real  # noqa: E402

sglang_real.require()  # raises, naming KVOFFLOAD_SGLANG_SRC, when it is not set

import sglang_env as env  # noqa: E402

PAGE_TOKENS = 64
LAYERS, HEAD_DIM = 32, 128


def pool_for(page_mib: int, pages: int):
    # MHA page_first, bf16: a page is 2 (K, V) x layers x 64 tokens x heads x 128 x 2 bytes
    # = heads MiB.
    return env.host_pool("mha", "page_first", tokens=pages * PAGE_TOKENS, layers=LAYERS,
                         heads=page_mib, head_dim=HEAD_DIM, page_size=PAGE_TOKENS)


def page_bytes(pool) -> int:
    return pool.get_dummy_flat_data_page().numel() * 2


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def run_backend(pool, storage, tokens, hi, ref, config=None):
    """One backup and one load through SGLang's controller; (backup s, load s)."""
    ctl = env.Controller(pool, storage, config)
    done, t_set = timed(lambda: ctl.backup(hi, tokens))
    assert done == len(tokens), f"backup stored {done} of {len(tokens)} tokens"
    pool.kv_buffer.zero_()
    (hit, loaded), t_get = timed(lambda: ctl.prefetch(tokens, hi))
    assert hit == loaded == len(tokens), f"load: hit {hit}, loaded {loaded} of {len(tokens)}"
    assert env.pages_equal(pool, ref, hi), "a loaded page differs from what was backed up"
    return t_set, t_get


def redis_benchmark(server, size, n, connections) -> dict:
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port),
                          "-t", "set,get", "-d", str(size), "-c", str(connections), "-P", "8",
                          "-n", str(n), "--csv"], capture_output=True, text=True, check=True,
                         timeout=600).stdout
    rps = {}
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if cells and cells[0] in ("SET", "GET"):
            rps[cells[0]] = float(cells[1])
    return {"set": rps["SET"] * size / 2**20, "get": rps["GET"] * size / 2**20}


def remote_bench(args):
    import store_servers

    server = store_servers.Server("redis", ["--maxmemory", "0"])
    rows = []
    try:
        for mib in args.sizes:
            pool = pool_for(mib, args.pages)
            size = page_bytes(pool)
            tokens = list(range(args.pages * PAGE_TOKENS))
            hi = pool.alloc(len(tokens))
            ref = pool.kv_buffer.clone()
            best = {"set": 0.0, "get": 0.0, "bench_set": 0.0, "bench_get": 0.0}
            for r in range(args.repeat):
                server.cli("FLUSHALL")
                storage = env.backend(pool, {"kvoffload_backend": "remote", "url": server.url,
                                             "connections_per_node": args.connections,
                                             "namespace": f"run{r}"})
                t_set, t_get = run_backend(pool, storage, tokens, hi, ref)
                storage.close()
                best["set"] = max(best["set"], args.pages * size / t_set / 2**20)
                best["get"] = max(best["get"], args.pages * size / t_get / 2**20)
                server.cli("FLUSHALL")
                rb = redis_benchmark(server, size, max(64, args.pages * 2), args.connections)
                best["bench_set"] = max(best["bench_set"], rb["set"])
                best["bench_get"] = max(best["bench_get"], rb["get"])
            rows.append({"page_mib": mib, **best})
            del pool, ref
    finally:
        server.close()
    return rows


def file_bench(args):
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile

    rows = []
    for mib in args.sizes:
        pool = pool_for(mib, args.pages)
        size = page_bytes(pool)
        tokens = list(range(args.pages * PAGE_TOKENS))
        hi = pool.alloc(len(tokens))
        ref = pool.kv_buffer.clone()
        best = {"kvo_set": 0.0, "kvo_get": 0.0, "hicache_set": 0.0, "hicache_get": 0.0}
        for _ in range(args.repeat):
            shutil.rmtree(args.dir, ignore_errors=True)
            os.makedirs(args.dir)
            storage = env.backend(pool, {"kvoffload_backend": "file", "root_dir": args.dir,
                                         "io_threads": args.threads,
                                         "direct_io": not args.buffered})
            t_set, t_get = run_backend(pool, storage, tokens, hi, ref)
            storage.close()
            best["kvo_set"] = max(best["kvo_set"], args.pages * size / t_set / 2**20)
            best["kvo_get"] = max(best["kvo_get"], args.pages * size / t_get / 2**20)
            # SGLang's HiCacheFile in the same directory, driven as SGLang drives it (no
            # interface_v1: the controller's generic copy path).
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = args.dir
            cfg = env.storage_config({"interface_v1": 0}, layout=pool.layout)
            hf = HiCacheFile(cfg)
            hf.register_mem_pool_host(pool)
            t_set, t_get = run_backend(pool, hf, tokens, hi, ref, cfg)
            best["hicache_set"] = max(best["hicache_set"], args.pages * size / t_set / 2**20)
            best["hicache_get"] = max(best["hicache_get"], args.pages * size / t_get / 2**20)
        rows.append({"page_mib": mib, **best})
        del pool, ref
    shutil.rmtree(args.dir, ignore_errors=True)
    return rows


def pool_bench(args):
    import tempfile

    import store_servers

    server = store_servers.Server("redis", ["--maxmemory", "0"])
    rows = []
    try:
        for mib in args.sizes:
            pool = pool_for(mib, args.pages)
            size = page_bytes(pool)
            tokens = list(range(args.pages * PAGE_TOKENS))
            hi = pool.alloc(len(tokens))
            ref = pool.kv_buffer.clone()
            best = {"pool_set": 0.0, "pool_get": 0.0, "redis_set": 0.0, "redis_get": 0.0}
            for r in range(args.repeat):
                shm = tempfile.mkdtemp(dir="/dev/shm", prefix="kvo-sglang-pool-bench-")
                try:
                    # A pool of --pages chunks. Unless --fresh-pool, a backup of other pages
                    # first maps every chunk in this process (a long-running instance's pool is
                    # mapped; a fresh one pays a page fault per 4 KiB on first touch), and the
                    # measured backup evicts those.
                    storage = env.backend(pool, {"kvoffload_backend": "pool", "shm_dir": shm,
                                                 "capacity_bytes": args.pages * size})
                    if not args.fresh_pool:
                        warm = [t + 10**9 for t in tokens]
                        assert env.Controller(pool, storage).backup(hi, warm) == len(warm)
                    t_set, t_get = run_backend(pool, storage, tokens, hi, ref)
                    storage.close()
                finally:
                    shutil.rmtree(shm, ignore_errors=True)
                best["pool_set"] = max(best["pool_set"], args.pages * size / t_set / 2**20)
                best["pool_get"] = max(best["pool_get"], args.pages * size / t_get / 2**20)
                server.cli("FLUSHALL")
                storage = env.backend(pool, {"kvoffload_backend": "remote", "url": server.url,
                                             "connections_per_node": args.connections,
                                             "namespace": f"run{r}"})
                t_set, t_get = run_backend(pool, storage, tokens, hi, ref)
                storage.close()
                best["redis_set"] = max(best["redis_set"], args.pages * size / t_set / 2**20)
                best["redis_get"] = max(best["redis_get"], args.pages * size / t_get / 2**20)
            rows.append({"page_mib": mib, **best})
            del pool, ref
    finally:
        server.close()
    return rows


def report(name, rows) -> None:
    for r in rows if name == "remote" else []:
        print(f"remote {r['page_mib']} MiB pages: set {r['set']:.0f} MiB/s "
              f"(redis-benchmark {r['bench_set']:.0f}, {r['set'] / r['bench_set']:.2f}x), "
              f"get {r['get']:.0f} MiB/s (redis-benchmark {r['bench_get']:.0f}, "
              f"{r['get'] / r['bench_get']:.2f}x)", flush=True)
    for r in rows if name == "file" else []:
        print(f"file {r['page_mib']} MiB pages: set {r['kvo_set']:.0f} MiB/s (HiCacheFile "
              f"{r['hicache_set']:.0f}, {r['kvo_set'] / r['hicache_set']:.2f}x), get "
              f"{r['kvo_get']:.0f} MiB/s (HiCacheFile {r['hicache_get']:.0f}, "
              f"{r['kvo_get'] / r['hicache_get']:.2f}x)", flush=True)
    for r in rows if name == "pool" else []:
        print(f"pool {r['page_mib']} MiB pages: set {r['pool_set']:.0f} MiB/s (local Redis "
              f"{r['redis_set']:.0f}, {r['pool_set'] / r['redis_set']:.2f}x), get "
              f"{r['pool_get']:.0f} MiB/s (local Redis {r['redis_get']:.0f}, "
              f"{r['pool_get'] / r['redis_get']:.2f}x)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/var/tmp/kvo-sglang-bench",
                    help="file: the directory both file backends use (removed after)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8], help="page MiB")
    ap.add_argument("--pages", type=int, default=32, help="pages per backup / load")
    ap.add_argument("--connections", type=int, default=4,
                    help="remote: connections per node, and redis-benchmark's -c")
    ap.add_argument("--threads", type=int, default=8, help="file: kvoffload's io_threads")
    ap.add_argument("--buffered", action="store_true",
                    help="file: kvoffload without O_DIRECT (through the page cache, as HiCacheFile)")
    ap.add_argument("--fresh-pool", action="store_true",
                    help="pool: back up into a pool this process never touched (page faults)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["file", "remote", "pool"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = {}
    for name, fn in (("remote", remote_bench), ("file", file_bench), ("pool", pool_bench)):
        if args.only in (None, name):
            out[name] = fn(args)
            if not args.json:
                report(name, out[name])  # as each part ends: a later part may fail
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
