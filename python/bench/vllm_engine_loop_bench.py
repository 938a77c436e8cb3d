#!/usr/bin/env python3
"""vLLM's scheduler step time with KvoffloadSpec against vLLM's CPUOffloadingSpec, in vLLM's real
engine loop (python/engine_tests/engine_loop.py: Scheduler + OffloadingConnector), on the same
random request streams (engine_loop.make_stream: shared prefixes, repeated prompts, preemption,
aborts).

Per spec and stream it reports:
- the scheduler's time per engine step: Scheduler.schedule() + Scheduler.update_from_output(),
  the scheduler-side connector and its OffloadingManager included (worker copies and the test
  forward pass are not);
- the time spent inside the OffloadingManager's methods per step (each call timed by a thin
  proxy, engine_loop.TimingManager, the same for both specs), with --by-method per method and per
  call; and the ratio net of the proxy's own share of each timed call (measured around a C
  function that does nothing, the same number of calls for both specs).

Both specs process identical work: every job completes within its step (engine_loop's
CompletionGate), so both schedulers see the same stream of events (python/engine_tests/
test_differential.py checks that they do). Best of --repeat runs.

Run under the vLLM harness (build first; tools/vllm-python.sh runs its set-up):
  tools/vllm-python.sh --tree ../shared/vllm-7cfb97e3-engine \\
    python/bench/vllm_engine_loop_bench.py [--steps 400] [--json]
"""

import argparse
import gc
import json
import logging
import statistics
import tempfile


def measure(spec, args, bpc):
    from engine_loop import Engine, make_stream, run_stream, spec_config

    stream = make_stream(args.seed, steps=args.steps, block=args.block, max_prompt_blocks=args.max_prompt_blocks)
    best = None
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as shm:
            extra = spec_config(spec, cpu_blocks=args.cpu_blocks // bpc, block_size=args.block,
                                blocks_per_chunk=bpc, policy=args.policy, store_threshold=1,
                                shm_dir=shm, page_bytes=2 * args.block * 4)
            engine = Engine(extra, block_size=args.block, num_gpu_blocks=args.gpu_blocks,
                            max_num_batched_tokens=args.batch_tokens, record=False)
            stream_copy = [(list(a), list(b), c) for a, b, c in stream]
            for i, (adds, aborts, _) in enumerate(stream_copy):
                stream_copy[i] = (adds, aborts, (None, None))  # every job completes in its step
            gc.collect()
            try:
                run_stream(engine, stream_copy)
            finally:
                engine.shutdown()
            steps = len(engine.scheduler_time)
            timed = engine.scheduler.connector.connector_scheduler.manager
            result = {"steps": steps,
                      "scheduler_us_per_step": sum(engine.scheduler_time) / steps * 1e6,
                      "scheduler_median_us": statistics.median(engine.scheduler_time) * 1e6,
                      "manager_us_per_step": sum(engine.manager_time) / steps * 1e6,
                      "manager_calls": len(engine.manager_time),
                      "manager_us_per_step_by_method": {
                          k: v / steps * 1e6 for k, v in sorted(timed.by_method.items())},
                      "calls_per_step_by_method": {
                          k: v / steps for k, v in sorted(timed.calls_by_method.items())}}
        if best is None or result["scheduler_us_per_step"] < best["scheduler_us_per_step"]:
            best = result
    return best


def proxy_floor_us(repeat: int = 7, n: int = 20000) -> float:
    """The timing proxy's own share of one timed call: engine_loop.TimingManager around a C
    function that does nothing ({}.get), best of `repeat` (the thread_time reads and the call
    through *args land partly inside each timed interval, the same for both specs)."""
    from engine_loop import TimingManager

    class Null:
        lookup = {}.get

    best = None
    for _ in range(repeat):
        timing = []
        proxy = TimingManager(Null(), timing)
        for _ in range(n):
            proxy.lookup(b"k", None)
        per_call = sum(timing) / n * 1e6
        best = per_call if best is None else min(best, per_call)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--gpu-blocks", type=int, default=256)
    ap.add_argument("--cpu-blocks", type=int, default=2048)
    ap.add_argument("--max-prompt-blocks", type=int, default=60)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--policy", default="lru", choices=["lru", "arc"])
    ap.add_argument("--bpc", default="1,4", help="GPU blocks per chunk to run, comma-separated")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--by-method", action="store_true",
                    help="also print each manager method's calls and time per step and per call")
    args = ap.parse_args()
    logging.disable(logging.WARNING)
    rows = []
    for bpc in (int(b) for b in args.bpc.split(",")):
        cpu = measure("cpu", args, bpc)
        kvo = measure("kvoffload", args, bpc)
        assert cpu["steps"] == kvo["steps"] and cpu["manager_calls"] == kvo["manager_calls"], (cpu, kvo)
        rows.append({"blocks_per_chunk": bpc, "policy": args.policy, "CPUOffloadingSpec": cpu,
                     "KvoffloadSpec": kvo,
                     "scheduler_speedup": cpu["scheduler_us_per_step"] / kvo["scheduler_us_per_step"],
                     "manager_speedup": cpu["manager_us_per_step"] / kvo["manager_us_per_step"]})
    floor = proxy_floor_us()
    for row in rows:
        calls = row["KvoffloadSpec"]["manager_calls"] / row["KvoffloadSpec"]["steps"]
        net = [row[n]["manager_us_per_step"] - calls * floor for n in ("CPUOffloadingSpec", "KvoffloadSpec")]
        row["proxy_floor_us_per_call"] = floor
        row["manager_speedup_net_of_proxy"] = net[0] / net[1] if net[1] > 0 else float("inf")
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.steps} stream steps, seed {args.seed}, {args.gpu_blocks} GPU blocks of {args.block} "
          f"tokens, {args.cpu_blocks} CPU blocks, {args.policy}; best of {args.repeat}")
    print(f"{'bpc':>3} {'spec':<18} {'steps':>5} {'sched us/step':>13} {'median':>8} "
          f"{'manager us/step':>15} {'calls':>6}")
    for row in rows:
        for name in ("CPUOffloadingSpec", "KvoffloadSpec"):
            r = row[name]
            print(f"{row['blocks_per_chunk']:>3} {name:<18} {r['steps']:>5} {r['scheduler_us_per_step']:>13.1f} "
                  f"{r['scheduler_median_us']:>8.1f} {r['manager_us_per_step']:>15.1f} {r['manager_calls']:>6}")
        print(f"    scheduler step {row['scheduler_speedup']:.2f}x, manager {row['manager_speedup']:.2f}x "
              f"({row['manager_speedup_net_of_proxy']:.2f}x net of the timing proxy's "
              f"{row['proxy_floor_us_per_call']:.2f} us per call) "
              "(CPUOffloadingSpec time / KvoffloadSpec time)")
        if args.by_method:
            cpu, kvo = row["CPUOffloadingSpec"], row["KvoffloadSpec"]
            print(f"    {'method':<20} {'calls/step':>10} {'CPU us/step':>11} {'kvo us/step':>11} "
                  f"{'CPU us/call':>11} {'kvo us/call':>11}")
            for name, calls in kvo["calls_per_step_by_method"].items():
                a = cpu["manager_us_per_step_by_method"].get(name, 0.0)
                b = kvo["manager_us_per_step_by_method"].get(name, 0.0)
                print(f"    {name:<20} {calls:>10.2f} {a:>11.2f} {b:>11.2f} "
                      f"{a / calls:>11.2f} {b / calls:>11.2f}")


if __name__ == "__main__":
    main()
