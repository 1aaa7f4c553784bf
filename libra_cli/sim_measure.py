"""Steps 1-3 of the simulator's validation (``libra_cli/sim_validation.py``): run the
demo job through a live stack and measure, in the run, what the replay needs.

The job (:func:`run_job`), its finished trajectories and events from Redis
(:func:`read_run`), each rollout instance's engine and loop profiles
(:func:`instance_profiles`), then the fallbacks, measured afterwards on the idle stack:
every recorded tool call re-issued with its own call id, every answer re-scored, and a
loop pass's Redis round trips. The heavy clients (Redis, gRPC) are imported inside the
functions, so ``libra sim --help`` loads none of them.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from libra import types as t


async def run_job(coordinator: str, spec_json: str, timeout_s: float = 600.0,
                  auth: Any = None) -> str:
    """Create the job and wait until it ends; return its id (``auth``: a ClientAuth)."""
    from libra.clients.coordinator import GrpcCoordinatorClient

    client = GrpcCoordinatorClient(coordinator, auth=auth)
    job = await client.create_job(spec_json, "json")
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            job, _steps, _counters = await client.get_job(job.job_id)
            if job.state.is_terminal:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job.job_id} not done after {timeout_s}s")
            await asyncio.sleep(0.3)
    finally:
        await client.close()
    if job.state is not t.JobState.SUCCEEDED:
        raise RuntimeError(f"job {job.job_id} ended {job.state.value}: {job.message}")
    return job.job_id


async def read_run(redis: Any, job_id: str) -> tuple[list[t.Trajectory], list[dict], dict]:
    """Finished trajectories, ``weights_loaded`` events and the job hash, from Redis."""
    from libra import redis_keys
    from libra.wire.common import decode_trajectory

    trajs = []
    for _, fields in await redis.xrange(redis_keys.trajectories(job_id)):
        traj = decode_trajectory(fields[b"data"])
        if traj.status is t.TrajectoryStatus.FINISHED:
            trajs.append(traj)
    events = []
    for entry_id, fields in await redis.xrange(redis_keys.events(job_id)):
        row = {k.decode(): v.decode() for k, v in fields.items()}
        row["at_ms"] = int(entry_id.decode().split("-")[0])
        events.append(row)
    job = {k.decode(): v.decode() for k, v in (await redis.hgetall(redis_keys.job(job_id))).items()}
    return trajs, events, job


async def _timed(coro: Any) -> float:
    """Wall time of one RPC; an RPC that answers with an error still took its round trip."""
    from libra.errors import LibraError

    started = time.perf_counter()
    try:
        await coro
    except LibraError:
        pass
    return time.perf_counter() - started


async def measure_tool_calls(gateway: Any, spec: Any, trajs: list[t.Trajectory]) -> dict:
    """Latency of every recorded tool call, re-issued with its own call id."""
    tool = spec.tools.enabled[0]
    options = spec.tools.options_for(tool)
    deadline_ms = int(min(5.0, spec.tools.call_timeout_s) * 1000)
    out: dict[str, list[float]] = {}
    for traj in trajs:
        lat = []
        for k in range(len(traj.tool_states)):
            call_id = f"{traj.trajectory_id}:t{k + 1}"  # the rollout's own call id
            lat.append(await _timed(gateway.execute(
                traj.trajectory_id, call_id, tool, {"expression": "1+1"}, deadline_ms, options)))
        out[traj.trajectory_id] = lat
    return out


async def measure_scoring(gateway: Any, spec: Any, trajs: list[t.Trajectory]) -> dict:
    """Scoring RPC latency of every trajectory that ended with an answer (else 0)."""
    out = {}
    for traj in trajs:
        if not traj.final_text:
            out[traj.trajectory_id] = 0.0
            continue
        out[traj.trajectory_id] = await _timed(gateway.score(t.ScoreInput(
            traj.trajectory_id, spec.reward.name, traj.final_text, traj.reference,
            options_json=spec.reward.options_json())))
    return out


async def measure_round_trips(redis: Any, job_id: str, n: int = 50) -> dict:
    """Median 3-Redis-round-trip loop pass (idle stack; the fallback pass overhead)."""
    from libra import redis_keys

    passes = []
    for _ in range(n):
        started = time.perf_counter()
        await redis.hget(redis_keys.job(job_id), "state")
        await redis.hgetall(redis_keys.policy(job_id))
        await redis.xlen(redis_keys.trajectories(job_id))
        passes.append(time.perf_counter() - started)
    return {"pass_overhead_s": statistics.median(passes)}


async def instance_profiles(state: dict[str, Any], instances: Iterable[str]
                            ) -> tuple[dict[str, list], dict[str, dict]]:
    """Every rollout instance's (of ``instances``, by name) engine calls and loop
    profile, as it timed them during the run."""
    from libra.grpcx import client_channel
    from libra.proto.rollout.v1 import rollout_pb2 as pb
    from libra.proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
    from libra_cli.credentials import stack_auth

    names = set(instances)
    engine, loop = {}, {}
    for svc in state["services"]:
        if svc["name"] not in names:
            continue
        auth = stack_auth(Path(state["run_root"]), internal=True)
        async with client_channel(f"127.0.0.1:{svc['port']}", auth) as channel:
            resp = await pb_grpc.RolloutServiceStub(channel).GetInstanceStatus(
                pb.GetInstanceStatusRequest(), timeout=10.0)
        engine[svc["name"]] = json.loads(resp.engine_profile_json or "[]")
        loop[svc["name"]] = json.loads(resp.loop_profile_json or "{}")
    return engine, loop


async def run_and_measure(state: dict[str, Any], spec_json: str,
                          instances: Iterable[str]) -> dict[str, Any]:
    """Steps 1-3 against the live stack: the job, the instances' engine and loop
    profiles, then the idle re-issue of its tool calls and scoring (fallbacks)."""
    import redis.asyncio as aioredis

    from libra.clients.toolgateway import GrpcToolGatewayClient
    from libra.jobspec import job_spec_from_json
    from libra_cli import stack
    from libra_cli.credentials import stack_auth

    redis = aioredis.from_url(state["redis_url"], decode_responses=False)
    port = {svc["name"]: svc["port"] for svc in state["services"]}
    internal = stack_auth(Path(state["run_root"]), internal=True)
    gateway = GrpcToolGatewayClient(f"127.0.0.1:{port['toolgateway']}", auth=internal)
    try:
        job_id = await run_job(stack.coordinator_address(state), spec_json,
                               auth=stack_auth(Path(state["run_root"])))
        profiles, loop = await instance_profiles(state, instances)
        trajs, events, job = await read_run(redis, job_id)
        spec = job_spec_from_json(job["spec_json"])
        tool_s = await measure_tool_calls(gateway, spec, trajs)
        score_s = await measure_scoring(gateway, spec, trajs)
        idle = await measure_round_trips(redis, job_id)
    finally:
        await gateway.close()
        await redis.aclose()
    return {"job_id": job_id, "trajs": trajs, "events": events, "spec": spec,
            "profiles": profiles, "loop": loop, "tool_s": tool_s, "score_s": score_s,
            "idle": idle}
