#!/usr/bin/env python3
"""Speed of kvoffload.vllm.KvoffloadManager against vLLM's own CPUOffloadingManager, both imported
from the same vLLM tree (run with tools/vllm-python.sh: vLLM's engine tree under the vLLM
harness, as the tests run), side by side in one run, through vLLM's Python interface, on the same
vLLM-style request stream:

  20k requests x 8 keys drawn from 200k, 50k blocks, ARC or LRU. Per request: look up until the
  first non-hit, touch the request's keys, prepare and complete the load of the hits, prepare and
  complete the store of the rest (what vLLM's scheduler calls per request).

Keys (36-byte vLLM OffloadKeys, distinct within a request) are built beforehand; each manager replays the same stream from
a fresh state; the best of --repeat runs is reported, and the two must agree on every hit count.

--trace FILE replays a `kvoffload simulate` trace instead (hex keys turned into bytes beforehand),
the same per-request calls, to compare with `kvoffload simulate` on the same file.

Times are CPU seconds of this process (time.process_time), so a busy machine does not inflate
them; wall seconds are printed too.

Run (build first):
  tools/vllm-python.sh python/bench/vllm_manager_bench.py [--policy lru]
"""

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path


def make_stream(requests, keys_per_request, universe, seed):
    rng = random.Random(seed)
    pool = [rng.getrandbits(256).to_bytes(32, "little") + (0).to_bytes(4, "big") for _ in range(universe)]
    # Distinct keys within a request, as vLLM's prefix-chained block hashes are.
    return [[pool[i] for i in rng.sample(range(universe), keys_per_request)] for _ in range(requests)]


def read_trace(path):
    stream = []
    with open(path) as f:
        for line in f:
            tokens = line.split()
            if tokens and not tokens[0].startswith("#"):
                stream.append([bytes.fromhex(t.zfill(32)) for t in tokens])
    return stream


def replay(manager, stream, ctx, hit_value):
    lookup = manager.lookup
    hits_total = 0
    for keys in stream:
        hits = 0
        for k in keys:
            if lookup(k, ctx) != hit_value:
                break
            hits += 1
        manager.touch(keys, ctx)
        if hits:
            loaded = keys[:hits]
            manager.prepare_load(loaded, ctx)
            manager.complete_load(loaded, ctx)
            hits_total += hits
        rest = keys[hits:]
        out = manager.prepare_store(rest, ctx)
        if out is not None and out.keys_to_store:
            manager.complete_store(out.keys_to_store, ctx)
    return hits_total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--keys-per-request", type=int, default=8)
    ap.add_argument("--universe", type=int, default=200_000)
    ap.add_argument("--blocks", type=int, default=50_000)
    ap.add_argument("--policy", default="arc", choices=["lru", "arc"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--trace", help="replay this `kvoffload simulate` trace instead")
    ap.add_argument("--only", help="comma-separated managers to time (default: all available)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import vllm_real

    tree = vllm_real.require()  # raises outside tools/vllm-python.sh (the vLLM harness)
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from kvoffload.vllm import KvoffloadManager

    makers = {
        "kvoffload": lambda: KvoffloadManager(args.blocks, cache_policy=args.policy),
        "vllm": lambda: CPUOffloadingManager(args.blocks, cache_policy=args.policy),
    }
    if args.only:
        makers = {k: v for k, v in makers.items() if k in args.only.split(",")}
    if args.trace:
        stream = read_trace(args.trace)
        args.requests = len(stream)
    else:
        stream = make_stream(args.requests, args.keys_per_request, args.universe, args.seed)
    ctx = ReqContext(req_id="bench")
    results = {}
    for name, make in makers.items():
        best = None
        best_wall = None
        hits = None
        for _ in range(args.repeat):
            manager = make()
            gc.collect()
            w0 = time.perf_counter()
            t0 = time.process_time()
            hits = replay(manager, stream, ctx, LookupResult.HIT)
            dt = time.process_time() - t0
            dw = time.perf_counter() - w0
            best = dt if best is None else min(best, dt)
            best_wall = dw if best_wall is None else min(best_wall, dw)
        results[name] = {"seconds": best, "wall_seconds": best_wall, "hits": hits,
                         "us_per_request": best / args.requests * 1e6}
    base = results[next(iter(results))]["seconds"]
    for r in results.values():
        r["ratio_to_first"] = r["seconds"] / base
    if len({r["hits"] for r in results.values()}) != 1:
        raise SystemExit(f"managers disagree on hits: {results}")
    if args.json:
        print(json.dumps({"config": vars(args), "vllm_tree": str(tree), "results": results}, indent=1))
        return
    what = args.trace or (f"{args.requests} requests x {args.keys_per_request} keys from {args.universe}")
    print(f"{what}, {args.blocks} blocks, {args.policy}; best of {args.repeat} (CPU seconds); "
          f"vLLM from {tree}")
    for name, r in results.items():
        print(f"  {name:10s} {r['seconds']:.3f} s CPU ({r['wall_seconds']:.3f} s wall)  "
              f"{r['us_per_request']:.2f} us/request  hits {r['hits']}  "
              f"({r['ratio_to_first']:.2f}x the first's time)")
    if {"kvoffload", "vllm"} <= results.keys():
        print(f"  speed-up: {results['vllm']['seconds'] / results['kvoffload']['seconds']:.1f}x")


if __name__ == "__main__":
    main()
