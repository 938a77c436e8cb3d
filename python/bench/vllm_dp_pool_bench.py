#!/usr/bin/env python3
"""The data-parallel sharing benefit of kvoffload's node pool, in vLLM's real engine loop
(python/engine_tests/engine_loop.py: Scheduler + OffloadingConnector, both halves, host backend).

Two replicas (two engines, each with its own scheduler and connector) serve one request stream
round-robin, as vLLM's DP load balancer spreads requests: each request is one of --prefixes
shared prefixes (--prefix-blocks full blocks) plus a tail of its own. For every request replica 1
serves whose prefix replica 0 served first (and replica 1 never did), the hit rate is the
external computed tokens vLLM's scheduler was told / the prefix's tokens. With
"kvoffload_pool": "node" both replicas attach one NodePool; with the default private pools
("private") each has its own region, so replica 1 cannot hit replica 0's prefixes.

Run under the vLLM harness (build first; tools/vllm-python.sh runs its set-up):
  PYTHONHASHSEED=0 tools/vllm-python.sh --tree ../shared/vllm-7cfb97e3-engine \\
    python/bench/vllm_dp_pool_bench.py [--requests 200] [--json]
"""

import argparse
import json
import random
import shutil
import tempfile


def run(mode, args):
    from engine_loop import Engine
    from test_node_pool import BLOCK, pool_config, serve

    rng = random.Random(args.seed)
    prefixes = [[rng.randrange(1, 30000) for _ in range(args.prefix_blocks * BLOCK)]
                for _ in range(args.prefixes)]
    shm = tempfile.mkdtemp(dir="/dev/shm", prefix="kvoffload-dp-bench-")
    chunks = args.prefixes * (args.prefix_blocks + 2) * 2  # room for every prefix and tail
    replicas = [Engine(pool_config(shm, mode=mode, chunks=chunks), block_size=BLOCK,
                       num_gpu_blocks=args.gpu_blocks, record=True) for _ in range(2)]
    first_server: dict[int, int] = {}
    served_by_1: set[int] = set()
    hit_tokens = asked_tokens = cross_requests = 0
    try:
        for i in range(args.requests):
            r = i % 2
            p = rng.randrange(args.prefixes)
            tokens = prefixes[p] + [rng.randrange(1, 30000) for _ in range(rng.randrange(1, BLOCK))]
            external = serve(replicas[r], f"q{i}", tokens)
            first_server.setdefault(p, r)
            if r == 1 and first_server[p] == 0 and p not in served_by_1:
                cross_requests += 1
                asked_tokens += len(prefixes[p])
                hit_tokens += min(external, len(prefixes[p]))
            if r == 1:
                served_by_1.add(p)
        checked = sum(e.blocks_checked for e in replicas)
    finally:
        for e in replicas:
            e.shutdown()
        shutil.rmtree(shm, ignore_errors=True)
    return {"mode": mode, "requests": args.requests, "cross_requests": cross_requests,
            "replica1_hit_rate_on_replica0_prefixes": hit_tokens / asked_tokens if asked_tokens else 0.0,
            "blocks_checked": checked}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prefixes", type=int, default=40)
    ap.add_argument("--prefix-blocks", type=int, default=6)
    ap.add_argument("--gpu-blocks", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [run(mode, args) for mode in ("node", "private")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'pool':8} {'requests':>8} {'r1 on r0 prefixes':>18} {'hit rate':>9} {'blocks checked':>15}")
    for r in results:
        print(f"{r['mode']:8} {r['requests']:8d} {r['cross_requests']:18d} "
              f"{r['replica1_hit_rate_on_replica0_prefixes']:9.3f} {r['blocks_checked']:15d}")


if __name__ == "__main__":
    main()
