"""The trainer drops its series of deleted jobs (services/trainer/job_series.py).

Real: the trainer store's job fields (the in-memory store of the store contract), run
folders on disk, the process's Prometheus registry.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from prometheus_client import REGISTRY

from libra import metrics
from services.trainer.job_series import job_is_gone
from services.trainer.memory_store import MemoryTrainerStore


async def test_only_deleted_or_ended_jobs_without_a_folder_are_gone(tmp_path: Path) -> None:
    store = MemoryTrainerStore()
    for job_id, state in (("running", "running"), ("ended", "succeeded")):
        (tmp_path / job_id).mkdir()
        store.put_job(job_id, "{}", str(tmp_path / job_id), state=state)
    assert not await job_is_gone(store, "running")
    assert not await job_is_gone(store, "ended")  # its folder is still there
    assert await job_is_gone(store, "never-stored")
    shutil.rmtree(tmp_path / "ended")  # `libra gc`
    shutil.rmtree(tmp_path / "running")
    assert await job_is_gone(store, "ended")
    assert not await job_is_gone(store, "running")  # running: kept whatever the disk


async def test_pruning_removes_the_eval_and_staleness_series_of_a_gone_job(
        tmp_path: Path) -> None:
    store = MemoryTrainerStore()
    store.put_job("job-kept", "{}", str(tmp_path / "job-kept"), state="running")
    for job_id in ("job-kept", "job-gc"):
        metrics.gauge("libra_job_eval_round").labels(job_id).set(3)
        metrics.histogram("libra_trainer_staleness").labels(job_id).observe(1)
    gone = await metrics.prune_jobs(lambda j: job_is_gone(store, j))
    assert "job-gc" in gone and "job-kept" not in gone
    assert REGISTRY.get_sample_value("libra_job_eval_round", {"job": "job-gc"}) is None
    assert REGISTRY.get_sample_value("libra_trainer_staleness_count", {"job": "job-gc"}) is None
    assert REGISTRY.get_sample_value("libra_job_eval_round", {"job": "job-kept"}) == 3
