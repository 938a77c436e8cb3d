# vLLM's real Scheduler + OffloadingConnector over random request streams, once with vLLM's
# CPUOffloadingSpec (its CPUOffloadingManager; the worker copies as vLLM's CPU worker does,
# engine_loop.ReferenceWorker) and once with KvoffloadSpec (kvoffload's C++ manager and its real
# worker on the host backend): every step, everything the scheduler sees must be identical
# (engine_loop.Recorder's list: scheduled tokens, preemptions, the connector metadata's load,
# store and flush lists, external computed tokens, every manager call and result, KV events,
# stats without transfer times, completed jobs), and every full block of every running request
# must hold its bytes, so each block a load brought back is checked byte for byte.
# Runs under the vLLM harness (tools/vllm-engine-tests.sh), once per vLLM tree.
import pytest

from engine_loop import Engine, make_stream, run_stream, spec_config

BLOCK = 16


def count(log, what):
    return sum(1 for step in log for entry in step if entry[0] == what)


CASES = [
    # seed, eviction policy, GPU blocks per chunk, store threshold, async scheduling
    (1, "lru", 1, 1, False),
    (2, "arc", 1, 1, False),
    (3, "lru", 2, 1, False),
    (4, "arc", 4, 1, False),
    (5, "lru", 1, 2, False),
    (6, "arc", 2, 2, False),
    (7, "lru", 1, 1, True),
    (8, "arc", 2, 2, True),
]


@pytest.mark.parametrize("seed,policy,bpc,threshold,async_scheduling", CASES,
                         ids=[f"seed{c[0]}-{c[1]}-bpc{c[2]}-threshold{c[3]}" + ("-async" if c[4] else "")
                              for c in CASES])
def test_kvoffload_and_vllms_cpu_spec_are_indistinguishable_to_the_scheduler(tmp_path, seed, policy, bpc, threshold,
                                                                            async_scheduling):
    stream = make_stream(seed, steps=160)
    logs, engines = [], []
    for spec in ("cpu", "kvoffload"):
        extra = spec_config(spec, cpu_blocks=(48 if threshold == 1 else 24) // bpc, block_size=BLOCK, blocks_per_chunk=bpc,
                            policy=policy, store_threshold=threshold, shm_dir=str(tmp_path),
                            page_bytes=2 * BLOCK * 4)
        engine = Engine(extra, block_size=BLOCK, num_gpu_blocks=24, async_scheduling=async_scheduling)
        engines.append(engine)
        try:
            logs.append(run_stream(engine, stream))
        finally:
            engine.shutdown()
    cpu, kvo = logs
    assert type(engines[0].manager).__name__ == "CPUOffloadingManager"
    assert type(engines[1].manager).__name__ == "KvoffloadManager"
    for i, (a, b) in enumerate(zip(cpu, kvo)):
        if a != b:
            diff = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y) if len(a) == len(b) else None
            where = f"entry {diff}: {a[diff]!r} != {b[diff]!r}" if diff is not None else f"{a!r} != {b!r}"
            pytest.fail(f"step {i}: the scheduler saw different things ({where})")
    assert len(cpu) == len(kvo)
    # The stream exercised what it is for.
    loads = sum(1 for step in cpu for e in step if e[0] == "scheduled" and e[3])
    stores = sum(1 for step in cpu for e in step if e[0] == "scheduled" and e[4])
    flushes = sum(1 for step in cpu for e in step if e[0] == "scheduled" and e[5])
    preempted = sum(1 for step in cpu for e in step if e[0] == "scheduled" and e[2])
    evicted = sum(1 for step in cpu for e in step
                  if e[0] == "prepare_store" and e[3] is not None and e[3][1].get("evicted_keys"))
    hits = sum(1 for step in cpu for e in step if e[0] == "external_tokens" and e[3][0])
    assert min(loads, stores, flushes, preempted, evicted, hits) > 0, (loads, stores, flushes, preempted, evicted, hits)
    assert count(cpu, "aborted") > 0
    # KV events (BlockStored / BlockRemoved) and the manager's stats (cache usage) reached the
    # scheduler and were compared, and are not all trivial.
    kinds = {ev[0] for step in cpu for e in step if e[0] == "kv_events" for ev in e[1]}
    assert {"BlockStored", "BlockRemoved"} <= kinds, kinds
    values = [value for step in cpu for e in step if e[0] == "get_stats" and e[1]
              for series in e[1]["data"].values() for value in series.values()]
    numbers = [x for v in values for x in (v if isinstance(v, list) else [v]) if isinstance(x, (int, float))]
    assert numbers and max(numbers) > 0, "no non-zero stats were compared"
