# kvoffload_bringup='background' inside vLLM's real engine loop (engine_loop.Engine: vLLM's
# Scheduler and both halves of its OffloadingConnector with KvoffloadSpec), on a two-rank engine:
# rank 0 is the loop's own KvoffloadWorker, rank 1 a second KvoffloadWorker over the same device
# tensors that the test brings up at a chosen step, so the ready prefix on every rank is 0 until
# then whatever the timing. Both ranks get every job and both report it, as vLLM's executor
# aggregates its workers' completions. The scheduler must schedule no store before rank 1 is up
# (it hands out no chunk beyond the ready prefix), serve once its first piece is, and the loop
# checks every block a load brings back byte for byte. Runs under the vLLM harness
# (tools/vllm-engine-tests.sh).
import pytest

import engine_loop
import kvoffload.vllm as kv_vllm
from engine_loop import Engine, make_stream, spec_config

BLOCK = 16
PAGE = 2 * BLOCK * 4  # engine_loop's layer: 2 x block x 1 x 1 float32
JOIN_AT = 40  # the step at which rank 1 comes


class TwoRanks:
    """Both ranks' workers behind the connector's one: each job goes to every rank present and
    is passed on once all have finished it; the connector's worker metadata then counts it for
    both ranks (two_rank_meta), as vLLM's executor sums its two workers' completions."""

    def __init__(self, rank0):
        self.ranks = [rank0]
        self.done = [{}]

    def add(self, rank1):
        self.ranks.append(rank1)
        self.done.append({})

    def submit_store(self, job_id, src_spec, dst_spec):
        return all([w.submit_store(job_id, src_spec, dst_spec) for w in self.ranks])

    def submit_load(self, job_id, src_spec, dst_spec):
        return all([w.submit_load(job_id, src_spec, dst_spec) for w in self.ranks])

    def get_finished(self):
        # A job is passed on once every rank has finished it (rank 0's result, in its order).
        for w, done in zip(self.ranks, self.done):
            for r in w.get_finished():
                assert r.success, f"rank {self.ranks.index(w)}: job {r.job_id} failed"
                done[r.job_id] = r
        out = [r for j, r in list(self.done[0].items()) if all(j in d for d in self.done)]
        for r in out:
            for d in self.done:
                del d[r.job_id]
        return out

    def wait(self, job_ids):
        for w in self.ranks:
            w.wait(job_ids)

    def shutdown(self):
        for w in self.ranks:
            w.shutdown()


@pytest.fixture
def two_ranks(monkeypatch):
    real_config = engine_loop.create_vllm_config

    def two_rank_config(**kw):
        config = real_config(**kw)
        config.parallel_config.world_size = 2  # a two-rank region; rank 0 is the loop's worker
        return config

    monkeypatch.setattr(engine_loop, "create_vllm_config", two_rank_config)
    caches = []
    real_get_worker = kv_vllm.KvoffloadSpec.get_worker

    def get_worker(self, kv_caches):
        caches.append(kv_caches)
        return real_get_worker(self, kv_caches)

    monkeypatch.setattr(kv_vllm.KvoffloadSpec, "get_worker", get_worker)
    return caches


@pytest.mark.parametrize("seed", [11, 12])
def test_no_store_before_every_rank_is_up_then_served_from_the_first_piece(tmp_path, two_ranks,
                                                                           seed):
    extra = spec_config("kvoffload", cpu_blocks=512, block_size=BLOCK, blocks_per_chunk=1,
                        policy="lru", store_threshold=1, shm_dir=str(tmp_path), page_bytes=PAGE)
    extra.update(kvoffload_bringup="background", kvoffload_bringup_piece=4096,
                 kvoffload_engine_id=f"bringup-loop-{seed}")
    engine = Engine(extra, block_size=BLOCK, num_gpu_blocks=24, gate=False)
    half = engine.worker_connector.connector_worker
    ranks = half.worker = TwoRanks(engine.worker)
    build_meta = engine.worker_connector.build_connector_worker_meta

    def two_rank_meta():
        meta = build_meta()
        if meta is not None:
            for job in meta.completed_jobs:
                meta.completed_jobs[job] = len(ranks.ranks) if len(ranks.ranks) == 2 else 1
        return meta

    engine.worker_connector.build_connector_worker_meta = two_rank_meta
    try:
        spec = engine.spec
        assert spec.bringup == "background" and spec.world_size == 2
        core = engine.manager._core
        rank0 = engine.worker._worker  # kvoffload.OffloadWorker underneath the loop's worker
        stores_before = stores_after = 0
        for step, (adds, aborts, _) in enumerate(make_stream(seed, steps=120)):
            if step == JOIN_AT:
                assert stores_before == 0, "a store was scheduled before rank 1 had any chunk up"
                assert core.ready_chunks == 0
                ranks.add(kv_vllm.KvoffloadWorker(
                    two_ranks[0], engine_id=spec.engine_id(), num_blocks=spec.num_blocks,
                    blocks_per_chunk=1, slot_bytes=spec.slot_bytes, rank=1, world_size=2,
                    backend="host", shm_dir=str(tmp_path), bringup="background",
                    bringup_piece_bytes=4096))
            for req_id, prompt, max_tokens in adds:
                engine.add_request(req_id, prompt, max_tokens)
            for req_id in aborts:
                engine.abort(req_id)
            log = engine.step()
            ready = rank0.chunks_ready_on_all_ranks()
            for entry in log:
                if entry[0] == "prepare_store" and entry[3] is not None:
                    slots = entry[3][1]["store_spec"][1]["block_ids"]
                    assert all(c < ready for c in slots), f"step {step}: {slots}, {ready} up"
                if entry[0] == "scheduled" and entry[4]:
                    if step < JOIN_AT:
                        stores_before += 1
                    else:
                        stores_after += 1
        for _ in range(200):
            if not engine.busy():
                break
            engine.step()
        assert not engine.busy(), "the engine did not drain"
        assert stores_after > 0 and engine.blocks_checked > 0
        assert ranks.ranks[1].bringup_status()["state"] == "ready"
    finally:
        engine.shutdown()
