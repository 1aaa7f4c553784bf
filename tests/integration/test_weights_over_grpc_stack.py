"""`libra up` with rollout instances that read nothing from the run folder: both take the
job's model directory and every published version from the trainer over gRPC
(``LIBRA_ROLLOUT_WEIGHTS_SOURCE=grpc``), and the job runs to the end as over the shared
path. Real: Redis, the five service processes, the trainer's weight service, the
rollouts' fetchers and cache directories."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_sync

from libra import redis_keys as keys
from libra import types as t
from libra_cli import stack
from tests.integration.stack_helpers import small_job, stack_up, wait_for_job

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def grpc_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict, Path]]:
    tmp = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as env:  # the launcher passes its environment on
        env.setenv("LIBRA_ROLLOUT_WEIGHTS_SOURCE", "grpc")
        # Each instance caches under <tmp>/libra-weights/<instance_id> (the default).
        env.setenv("TMPDIR", str(tmp))
        for state in stack_up(tmp_path_factory.mktemp("runs"), restart_limit=0):
            yield state, tmp / "libra-weights"


async def test_a_job_runs_on_weights_fetched_over_grpc(grpc_stack: tuple[dict, Path]) -> None:
    state, cache = grpc_stack
    client = stack.coordinator_client(state)
    job = await client.create_job(small_job(), "json")
    job, steps, _ = await wait_for_job(client, job.job_id)
    await client.close()
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert steps[-1]["policy_version"] == 3
    r = redis_sync.from_url(state["redis_url"], decode_responses=True)
    loads = [f for _, f in r.xrange(keys.events(job.job_id)) if f["kind"] == "weights_loaded"]
    assert {f["instance"] for f in loads} == {"rollout-0", "rollout-1"}
    assert not [f for _, f in r.xrange(keys.events(job.job_id))
                if f["kind"] in ("weights_checksum_mismatch", "weights_fetch_failed")]
    # Both instances built their engine from a fetched model dir and hold fetched versions.
    for instance in ("rollout-0", "rollout-1"):
        job_cache = cache / instance / job.job_id
        assert (job_cache / "model" / "config.json").is_file()
        assert list(job_cache.glob("v*.safetensors"))
