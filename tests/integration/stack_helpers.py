"""Helpers for tests that run the real stack: Redis + the five services as processes."""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from libra import redis_keys as keys
from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.errors import DeadlineExceeded, Unavailable
from libra.redis_connect import redis_client_sync
from libra_cli import stack
from libra_cli.report import build_report

ROOT = Path(__file__).resolve().parents[2]


def small_job(policy: str = "least_loaded", **algorithm: Any) -> str:
    """The demo spec shrunk to seconds of work, as a JSON document.

    ``least_loaded`` by default (not the demo's C-MLFQ) so both instances get work from
    the first step, which the fault-injection tests rely on.
    """
    spec = tomllib.loads((ROOT / "deploy" / "configs" / "demo.toml").read_text())
    spec["name"] = "itest"
    spec["layout"]["policy"] = policy
    spec["algorithm"].update({"num_steps": 3, "prompts_per_step": 2, "samples_per_prompt": 2,
                              "sft_steps": 5, "sft_batch_size": 8})
    spec["algorithm"].update(algorithm)
    return json.dumps(spec)


def migrating_cmlfq_job(num_steps: int) -> str:
    """A C-MLFQ job whose trajectories move: the model calls tools after 300 SFT steps,
    `short` holds one token, so once the prefix tree has evidence (after step 1) a tool
    return in `short` is a MOVE to `long`. Four groups a step: enough tool returns in
    `short` that some decision comes back while its trajectory still runs (a move decided
    after its last turn is moot). The reference's rules (issue 20 made Libra's the
    default): entry in `short`, and one visit is evidence, so the move is certain."""
    spec = json.loads(small_job(policy="cmlfq", num_steps=num_steps, sft_steps=300,
                                prompts_per_step=4))
    spec["layout"]["buckets"][0]["max_tokens"] = 1
    spec["layout"]["cmlfq"] = {"rebuild_interval_steps": 1, "entry": "shortest",
                               "disagree_rule": "stay", "live_thresholds": False,
                               "min_node_visits": 1, "max_queue_length": 0}
    return json.dumps(spec)


def write_stack(path: Path, restart_limit: int, lease_ttl_ms: int | None = None) -> Path:
    """A stack file: two rollout instances in two buckets (the second one lendable to
    training, as in the shipped stack), the given restart limit."""
    lines = [f"restart_limit = {restart_limit}", "shutdown_grace_s = 5.0"]
    for instance, bucket, role in (("rollout-0", "short", "core-rollout"),
                                   ("rollout-1", "long", "hybrid-rollout")):
        lines += ["[[rollout]]", f'instance_id = "{instance}"', f'bucket = "{bucket}"',
                  "max_batch_size = 8", "max_trajectories = 16", f'role = "{role}"']
    path.write_text("\n".join(lines) + "\n")
    return path


def stack_up(run_root: Path, restart_limit: int) -> Iterator[dict[str, Any]]:
    """Generator for module fixtures: `libra up` in ``run_root``, yield the state, down."""
    state = stack.up(run_root, write_stack(run_root / "stack.toml", restart_limit),
                     timeout_s=120)
    yield state
    stack.down(run_root)


async def get_job_across_restarts(client: GrpcCoordinatorClient, job_id: str,
                                  timeout_s: float = 60.0) -> tuple[t.Job, list[dict], dict]:
    """GetJob, retried while the coordinator is unreachable (being restarted)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            return await client.get_job(job_id)
        except (Unavailable, DeadlineExceeded):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


def event_kinds(redis_url: str, job_id: str) -> list[str]:
    """The kinds of the job's events, oldest first, read from Redis."""
    r = redis_client_sync(redis_url, decode_responses=True)
    return [fields["kind"] for _, fields in r.xrange(keys.events(job_id))]


async def wait_for_step(client: GrpcCoordinatorClient, job_id: str, step: int,
                        timeout_s: float = 180.0) -> t.Job:
    """Poll (across coordinator and Redis restarts) until the job reached ``step`` or
    ended."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job, _, _ = await get_job_across_restarts(client, job_id)
        if job.step >= step or job.state.is_terminal:
            return job
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not reach step {step} in {timeout_s}s")


async def wait_for_job(client: GrpcCoordinatorClient, job_id: str,
                       timeout_s: float = 240.0) -> tuple[t.Job, list[dict], dict]:
    """Poll until the job ends (or fail the test with its last known state); a
    coordinator being restarted meanwhile is waited for."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        job, steps, counters = await get_job_across_restarts(client, job_id)
        if job.state.is_terminal:
            return job, steps, counters
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"job {job_id} still {job.state.value} at step {job.step} "
                                 f"after {timeout_s}s; counters={counters}")
        await asyncio.sleep(0.3)


def assert_exact_accounting(redis_url: str, job: t.Job, steps: list[dict],
                            counters: dict) -> dict[str, Any]:
    """Nothing trained or dropped twice, and produced = trained + dropped + in flight.

    Returns the report's trajectory accounting.
    """
    r = redis_client_sync(redis_url)
    consumed = sum(counters.get(k, 0) for k in ("trained", "dropped_stale", "dropped_failed"))
    assert r.scard(keys.trained_ids(job.job_id)) == consumed
    report = build_report(job, steps, counters, 0.0)["trajectories"]
    # The in-flight term is measured from the stream (coordinator's GetJob), so the
    # identity below can fail: a lost or doubly counted trajectory shows as unaccounted.
    assert report["accounting"] == "measured"
    assert report["in_flight_at_end"] >= 0 and report["unaccounted"] == 0, report
    assert report["produced"] == (report["trained"] + report["dropped_stale"]
                                  + report["dropped_failed"] + report["in_flight_at_end"])
    return report
