"""Issue 6 item 5: predicted vs measured rollout time of a real CPU run of the demo.

Procedure (:func:`validate`), against a running stack (`libra up`):

1. run a short demo job (the demo spec, fewer steps) through the real services;
2. record its finished trajectories (``libra_cli/sim_record.py``) with their admission
   (``created_at_ms``, stamped by the scheduler) and finish (``finished_at_ms``,
   stamped by the rollout instance) times;
3. measure every cost the replay needs *in the run*: each rollout instance's engine
   calls (shape and wall time, timed by the engine in the serving process and read
   from ``GetInstanceStatus.engine_profile_json``; ``sim/cpu_engine.py`` fits the
   instance's step costs to them), its event loop's own costs (``loop_profile_json``:
   each pass's phases, each task's start lag, and every tool call and scoring RPC as
   the rollout's task saw it; ``sim/loop_costs.py``), the first job contact (first
   admission on an instance -> its ``weights_loaded`` of version 0) and the weight
   reloads (the rollout's own ``weights_loaded`` events). Fallbacks, used only where
   the run has no measurement (a ring buffer overflowed, an engine that logs nothing):
   afterwards, with the stack still up, each recorded tool call is re-issued with the
   *same call id* (deterministic outcomes; retries and back-off recur), each answer
   re-scored and a loop pass's Redis round trips timed. The delays nothing measures
   are read from the code and configuration they model (:func:`system_delays`);
4. replay the trace on the same instances, batch caps and policy (``sim/cpu_replay.py``)
   and compare.

**Rollout time** (the compared quantity) = the mean over the recorded trajectories of
``finished - admitted``: the time from the scheduler admitting a trajectory to the
rollout instance stamping it finished (all turns, tool calls and scoring included).
Admission times are inputs of the replay (the trainer's pace gates admission and is not
what is validated); everything after admission is predicted.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from libra import types as t

SPEC_OVERRIDES = {"num_steps": 12, "prompts_per_step": 4, "samples_per_prompt": 4,
                  "sft_steps": 500}
"""The demo spec with fewer steps (~20-40 s on 2 cores). The SFT warm-up (2600 steps in
the demo) only shapes the trajectories; 500 steps still give a policy that calls the
tool and answers (about a third of the trajectories take 2+ turns)."""
STACK_INSTANCES = (("rollout-0", "short"), ("rollout-1", "long"))
MAX_BATCH_SIZE = 8
MAX_TRAJECTORIES = 16
TOLERANCE = 0.20


def demo_spec(root: Path, **overrides: Any) -> str:
    """The demo job spec (``deploy/configs/demo.toml``) with ``SPEC_OVERRIDES``."""
    import tomllib

    spec = tomllib.loads((root / "deploy" / "configs" / "demo.toml").read_text())
    spec["name"] = "sim-validation"
    spec["layout"]["policy"] = "least_loaded"
    spec["algorithm"].update({**SPEC_OVERRIDES, **overrides})
    return json.dumps(spec)


def write_stack_file(path: Path) -> Path:
    """Two rollout instances with the rollout service's default caps."""
    lines = ["restart_limit = 0", "shutdown_grace_s = 5.0"]
    for iid, bucket in STACK_INSTANCES:
        lines += ["[[rollout]]", f'instance_id = "{iid}"', f'bucket = "{bucket}"',
                  f"max_batch_size = {MAX_BATCH_SIZE}", f"max_trajectories = {MAX_TRAJECTORIES}"]
    path.write_text("\n".join(lines) + "\n")
    return path


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


def reload_schedule(events: list[dict], t0_ms: int) -> tuple[tuple[float, ...], float]:
    """Publish times (s after ``t0_ms``) and median reload time, from ``weights_loaded``.

    A version's publish time is taken as the earliest start of its load on any instance
    (the load's end, the event time, minus its measured ``reload_s``).
    """
    starts: dict[int, float] = {}
    reloads = []
    for ev in events:
        if ev.get("kind") != "weights_loaded":
            continue
        version, reload_s = int(ev["version"]), float(ev["reload_s"])
        reloads.append(reload_s)
        start = (ev["at_ms"] - t0_ms) / 1000.0 - reload_s
        starts[version] = min(starts.get(version, start), start)
    publish = tuple(sorted(s for v, s in starts.items() if v > 0))
    return publish, (statistics.median(reloads) if reloads else 0.0)


def in_run_latencies(trajs: list[t.Trajectory], loop: dict[str, dict], tool_s: dict,
                     score_s: dict) -> tuple[dict, dict, dict[str, int]]:
    """Per trajectory: its tool-call and scoring latencies as its task saw them in the
    run, where the loop profiles hold them all; else the re-issued (idle) ones."""
    from sim.loop_costs import op_latencies

    run_tool, run_score = op_latencies(loop, "tool"), op_latencies(loop, "score")
    tools, scores, n = {}, {}, {"tool_in_run": 0, "tool_reissued": 0,
                                "score_in_run": 0, "score_reissued": 0}
    for tr in trajs:
        tid = tr.trajectory_id
        in_run = len(run_tool.get(tid, [])) == len(tool_s[tid])
        tools[tid] = run_tool[tid] if in_run and tool_s[tid] else tool_s[tid]
        n["tool_in_run" if in_run else "tool_reissued"] += len(tool_s[tid])
        has = score_s[tid] > 0 and len(run_score.get(tid, [])) == 1
        scores[tid] = run_score[tid][0] if has else score_s[tid]
        n["score_in_run" if has else "score_reissued"] += 1 if score_s[tid] > 0 else 0
    return tools, scores, n


def recorded(trajs: list[t.Trajectory], tool_s: dict, score_s: dict) -> list:
    """Trace records with measured tool latencies, admission and finish times."""
    from dataclasses import replace

    from libra_cli.sim_record import from_trajectory
    from sim.cpu_replay import RecordedTrajectory

    t0_ms = min(tr.created_at_ms for tr in trajs)
    out = []
    for tr in trajs:
        rec = from_trajectory(tr)
        if rec is None:
            continue
        lat = tool_s[tr.trajectory_id]
        turns = tuple(
            replace(turn, tool=replace(turn.tool, latency_s=lat[i])) if turn.tool else turn
            for i, turn in enumerate(rec.turns)
        )
        out.append(RecordedTrajectory(
            replace(rec, turns=turns), (tr.created_at_ms - t0_ms) / 1000.0,
            (tr.finished_at_ms - t0_ms) / 1000.0, score_s[tr.trajectory_id]))
    return out


def compare(recs: list, predicted_finish_s: list[float]) -> dict[str, Any]:
    """Predicted vs measured rollout time (mean of finish - admission) and makespans."""
    measured = [r.finished_s - r.admitted_s for r in recs]
    predicted = [p - r.admitted_s for r, p in zip(recs, predicted_finish_s, strict=True)]
    m, p = statistics.fmean(measured), statistics.fmean(predicted)
    return {
        "num_trajectories": len(recs),
        "measured_rollout_s": m,
        "predicted_rollout_s": p,
        "ratio": p / m,
        "within_tolerance": abs(p / m - 1.0) <= TOLERANCE,
        "tolerance": TOLERANCE,
        "measured_p90_s": statistics.quantiles(measured, n=10)[-1],
        "predicted_p90_s": statistics.quantiles(predicted, n=10)[-1],
        "measured_makespan_s": max(r.finished_s for r in recs),
        "predicted_makespan_s": max(predicted_finish_s),
    }


async def instance_profiles(state: dict[str, Any]) -> tuple[dict[str, list], dict[str, dict]]:
    """Every rollout instance's engine calls and loop profile, as it timed them during
    the run."""
    from libra.grpcx import client_channel
    from libra.proto.rollout.v1 import rollout_pb2 as pb
    from libra.proto.rollout.v1 import rollout_pb2_grpc as pb_grpc
    from libra_cli.credentials import stack_auth

    engine, loop = {}, {}
    for svc in state["services"]:
        if svc["name"] not in dict(STACK_INSTANCES):
            continue
        auth = stack_auth(Path(state["run_root"]), internal=True)
        async with client_channel(f"127.0.0.1:{svc['port']}", auth) as channel:
            resp = await pb_grpc.RolloutServiceStub(channel).GetInstanceStatus(
                pb.GetInstanceStatusRequest(), timeout=10.0)
        engine[svc["name"]] = json.loads(resp.engine_profile_json or "[]")
        loop[svc["name"]] = json.loads(resp.loop_profile_json or "{}")
    return engine, loop


async def _run_and_measure(state: dict[str, Any], spec_json: str) -> dict[str, Any]:
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
        profiles, loop = await instance_profiles(state)
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


def first_contact_s(trajs: list[t.Trajectory], events: list[dict]) -> dict[str, float]:
    """Per instance: first admission placed on it -> its ``weights_loaded`` of version 0.

    The first job contact (``RolloutCore._context``: spec and policy reads, the model
    load in a thread, the verified weight load) measured in the run itself: it runs
    under the job's start-up contention (both instances and the trainer load at once),
    which a load timed afterwards would not see.
    """
    first: dict[str, int] = {}
    for tr in trajs:
        first[tr.instance_id] = min(first.get(tr.instance_id, tr.created_at_ms),
                                    tr.created_at_ms)
    out = {}
    for ev in events:
        iid = ev.get("instance", "")
        if ev.get("kind") == "weights_loaded" and ev.get("version") == "0" and iid in first:
            out[iid] = max(0.0, (ev["at_ms"] - first[iid]) / 1000.0)
    return out


def engine_costs(profiles: dict[str, list[dict]]) -> tuple[dict, dict]:
    """Each instance's step costs fitted to its own in-run engine calls, and the fit's
    report (total measured vs fitted time, per-call error)."""
    from sim.cpu_engine import fit, fit_report

    costs, report = {}, {}
    for iid, calls in profiles.items():
        costs[iid] = fit(calls)
        report[iid] = {**fit_report(costs[iid], calls), "costs": costs[iid].to_dict()}
    return costs, report


def measured_gaps(m: dict[str, Any]) -> dict[str, float]:
    """Diagnostics (not replay inputs): where the measured time goes after the first wave.

    From the instances' engine-call timelines and the trajectories' stamps: a
    single-turn trajectory's finish minus the end of its instance's last engine call
    before it (the post-call path: parse, scoring RPC, stamp), and an admission to the
    start of its instance's next engine call (pick-up: inbox, pass, weight reload, and
    any call in flight).
    """
    calls = {iid: sorted((c["at_s"] - c["wall_s"], c["at_s"]) for c in cs)
             for iid, cs in m["profiles"].items()}
    t0_s = min(tr.created_at_ms for tr in m["trajs"]) / 1000.0
    post, pickup = [], []
    for tr in m["trajs"]:
        admitted, finished = tr.created_at_ms / 1000.0, tr.finished_at_ms / 1000.0
        spans = calls.get(tr.instance_id, [])
        if admitted - t0_s < 0.1 or not spans:
            continue  # the first wave waits for the first contact instead
        ends = [end for _, end in spans if end <= finished + 5e-4]
        if tr.num_turns == 1 and ends:
            post.append(finished - ends[-1])
        pickup += [start - admitted for start, _ in spans if start >= admitted][:1]
    return {"post_call_finish_s": statistics.fmean(post) if post else 0.0,
            "admission_to_call_s": statistics.fmean(pickup) if pickup else 0.0}


def system_delays() -> dict[str, float]:
    """The modelled system delays, each read from the code or configuration it models.

    - ``poll_s``: while every pinned trajectory waits on a tool, the rollout loop looks
      at its inbox again after ``WAIT_FOR_TOOLS_S`` (``services/rollout/core.py``); an
      idle instance blocks on its inbox and wakes at once on an arrival;
    - ``tick_s``: what finds no capacity waits for the scheduler's next admission /
      placement tick (``SchedulerConfig.tick_s``, the stack's default);
    - ``gil_wait_s`` (only for an instance without a loop profile; a measured RPC
      latency has its GIL wait in it): an RPC answer that arrives while the engine
      thread runs a call resumes its task only after the interpreter forces a GIL
      hand-over, one switch interval later (``sys.getswitchinterval()``, 5 ms).
    """
    import sys

    from services.rollout.core import WAIT_FOR_TOOLS_S
    from services.scheduler.config import SchedulerConfig

    return {"poll_s": WAIT_FOR_TOOLS_S, "tick_s": SchedulerConfig().tick_s,
            "gil_wait_s": sys.getswitchinterval()}


def replay_measured(m: dict[str, Any]) -> dict[str, Any]:
    """Build the stack model from the measurements, replay, compare."""
    from sim.cpu_replay import CpuReplay, CpuStack
    from sim.loop_costs import loop_costs, phase_means

    tool_s, score_s, sources = in_run_latencies(m["trajs"], m.get("loop", {}), m["tool_s"],
                                                m["score_s"])
    recs = recorded(m["trajs"], tool_s, score_s)
    loop = {iid: c for iid, prof in m.get("loop", {}).items()
            if (c := loop_costs(prof)) is not None}
    t0_ms = min(tr.created_at_ms for tr in m["trajs"])
    publish, reload_s = reload_schedule(m["events"], t0_ms)
    costs, fit_info = engine_costs(m["profiles"])
    first_load = first_contact_s(m["trajs"], m["events"])
    spec = m["spec"]
    cpu = CpuStack(
        instances=STACK_INSTANCES, buckets=tuple(spec.layout.buckets),
        policy=spec.layout.policy, max_batch_size=MAX_BATCH_SIZE,
        max_trajectories=MAX_TRAJECTORIES, costs=costs,
        pass_overhead_s=m["idle"]["pass_overhead_s"], loop=loop,
        first_load_s=first_load, reload_s=reload_s, publish_times_s=publish,
        **system_delays(),
    )
    result = compare(recs, CpuReplay(cpu, recs).run())
    result["measured_inputs"] = {
        "engine_fit": fit_info, "idle_round_trips": m["idle"], "first_load_s": first_load,
        "loop_costs": {iid: c.to_dict() for iid, c in loop.items()},
        "loop_phase_means": {iid: phase_means(p) for iid, p in m.get("loop", {}).items()},
        "rpc_latency_sources": sources,
        "reload_s": reload_s, "num_weight_versions": len(publish),
        "num_tool_calls": sum(len(v) for v in m["tool_s"].values()),
        "system_delays": system_delays(), "measured_gaps": measured_gaps(m),
    }
    return result


def validate(run_root: Path, repo_root: Path, **overrides: Any) -> dict[str, Any]:
    """The whole procedure: `libra up` in ``run_root``, run the job, measure, replay, down."""
    from libra_cli import stack

    started = time.perf_counter()
    state = stack.up(run_root, write_stack_file(run_root / "stack.toml"), timeout_s=120)
    try:
        measured = asyncio.run(_run_and_measure(state, demo_spec(repo_root, **overrides)))
    finally:
        stack.down(run_root)
    result = replay_measured(measured)
    result["job_id"] = measured["job_id"]
    result["wall_s"] = time.perf_counter() - started
    return result
