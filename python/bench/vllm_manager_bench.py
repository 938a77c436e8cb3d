#!/usr/bin/env python3
"""Speed of kvoffload.vllm.KvoffloadManager against CPUOffloadingManager's behaviour, through the
same Python interface, on a vLLM-style request stream (issue 12):

  20k requests x 8 keys drawn from 200k, 50k blocks, ARC. Per request: look up until the first
  non-hit, touch the request's keys, prepare and complete the load of the hits, prepare and
  complete the store of the rest.

Keys (36-byte vLLM OffloadKeys) are built beforehand; each manager replays the same stream from
a fresh state; the best of --repeat runs is reported. Managers compared:
  kvoffload   kvoffload.vllm.KvoffloadManager
  reference   python/tests/vllm_reference.py, CPUOffloadingManager's algorithm on its data
              structures (OrderedDicts), used where vLLM is not installed
  vllm        vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager itself (--vllm, needs vLLM)

Run (build first; the stand-in supplies vLLM's types when vLLM is absent):
  PYTHONPATH=build/cpu/python:python/tests/vllm_standin:python/tests \
    /usr/bin/python3 python/bench/vllm_manager_bench.py
"""

import argparse
import gc
import json
import random
import time


def make_stream(requests, keys_per_request, universe, seed):
    rng = random.Random(seed)
    pool = [rng.getrandbits(256).to_bytes(32, "little") + (0).to_bytes(4, "big") for _ in range(universe)]
    return [[pool[rng.randrange(universe)] for _ in range(keys_per_request)] for _ in range(requests)]


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
    ap.add_argument("--vllm", action="store_true", help="also time vLLM's own CPUOffloadingManager")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    from kvoffload.vllm import KvoffloadManager

    makers = {"kvoffload": lambda: KvoffloadManager(args.blocks, cache_policy=args.policy)}
    try:
        from vllm_reference import ReferenceManager

        makers["reference"] = lambda: ReferenceManager(args.blocks, args.policy)
    except ImportError:
        pass
    if args.vllm:
        from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

        makers["vllm"] = lambda: CPUOffloadingManager(args.blocks, cache_policy=args.policy)

    stream = make_stream(args.requests, args.keys_per_request, args.universe, args.seed)
    ctx = ReqContext(req_id="bench")
    results = {}
    for name, make in makers.items():
        best = None
        hits = None
        for _ in range(args.repeat):
            manager = make()
            gc.collect()
            t0 = time.perf_counter()
            hits = replay(manager, stream, ctx, LookupResult.HIT)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        results[name] = {"seconds": best, "hits": hits,
                         "us_per_request": best / args.requests * 1e6}
    base = results["kvoffload"]["seconds"]
    for r in results.values():
        r["kvoffload_speedup"] = r["seconds"] / base
    if len({r["hits"] for r in results.values()}) != 1:
        raise SystemExit(f"managers disagree on hits: {results}")
    if args.json:
        print(json.dumps({"config": vars(args), "results": results}, indent=1))
        return
    print(f"{args.requests} requests x {args.keys_per_request} keys from {args.universe}, "
          f"{args.blocks} blocks, {args.policy}; best of {args.repeat}")
    for name, r in results.items():
        print(f"  {name:10s} {r['seconds']:.3f} s  {r['us_per_request']:.2f} us/request  "
              f"hits {r['hits']}  ({r['kvoffload_speedup']:.2f}x kvoffload's time)")


if __name__ == "__main__":
    main()
