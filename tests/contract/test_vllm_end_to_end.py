"""One short job end to end with the vLLM backend (``engine = "vllm"``) on the tiny demo
model: Redis + the five services as processes, one rollout instance serving through vLLM.
Skipped where vLLM does not import; ``make test-vllm`` runs it in ``.venv-vllm``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_sync

from libra import redis_keys as keys
from libra import types as t
from libra_cli import stack
from services.rollout.vllm_engine import vllm_available
from tests.integration.stack_helpers import small_job, wait_for_job

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not vllm_available(), reason="vllm is not installed here")]


@pytest.fixture(scope="module")
def vllm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    run_root = tmp_path_factory.mktemp("runs")
    stack_file = run_root / "stack.toml"
    # One instance: each vLLM engine holds a core and ~1.8 GB; 2 cores here.
    stack_file.write_text('restart_limit = 0\nshutdown_grace_s = 5.0\n[[rollout]]\n'
                          'instance_id = "rollout-0"\nbucket = "short"\nmax_batch_size = 8\n'
                          'max_trajectories = 16\n')
    env = {"LIBRA_ROLLOUT_ENGINE": "vllm", "VLLM_CPU_KVCACHE_SPACE": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the launcher passes its environment to the services
    try:
        state = stack.up(run_root, stack_file, timeout_s=180)
        yield state
    finally:
        stack.down(run_root)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


async def test_short_job_runs_on_the_vllm_backend(vllm_stack: dict) -> None:
    spec = json.loads(small_job())
    spec["layout"]["buckets"] = [{"name": "short", "max_tokens": 256, "max_batch_size": 8,
                                  "max_trajectories_per_instance": 16}]
    client = stack.coordinator_client(vllm_stack)
    job = await client.create_job(json.dumps(spec), "json")
    job, steps, counters = await wait_for_job(client, job.job_id, timeout_s=480)
    await client.close()
    log = Path(vllm_stack["run_root"]) / ".libra" / "logs" / "rollout-0.log"
    text = log.read_text(errors="replace")
    assert job.state is t.JobState.SUCCEEDED, (job.message, text[-3000:])
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert counters["trained"] == 3 * 2 * 2
    assert "[vllm] engine started" in text  # the rollout instance really served via vLLM
    r = redis_sync.from_url(vllm_stack["redis_url"])
    assert int(r.hget(keys.policy(job.job_id), "version")) == 3
    for line in text.splitlines():
        if "[vllm] engine started" in line or "vllm loaded policy_version" in line:
            print(line.split("]", 2)[-1].strip())
