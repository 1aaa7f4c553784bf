"""Issue 6 item 5: predicted vs measured rollout time of a real CPU run of the demo.

Procedure (:func:`validate`), against a running stack (`libra up`):

1. run a short demo job (the demo spec, fewer steps) through the real services;
2. record its finished trajectories (``sim/record.py``) with their admission
   (``created_at_ms``, stamped by the scheduler) and finish (``finished_at_ms``,
   stamped by the rollout instance) times;
3. measure every cost the replay needs: *while the job runs*, a :class:`LoadProbe`
   times a gateway call, a scheduler RPC, a rollout loop pass's Redis round trips and a
   fixed CPU work unit every 20 ms (what the co-located processes experience on the
   loaded machine); afterwards, with the stack still up, each recorded tool call is
   re-issued with the *same call id* (deterministic outcomes; retries and back-off
   recur) and each answer re-scored; the engine's solo step costs are timed on the
   job's model (``sim/cpu_engine.py``) and scaled by the probe's CPU slowdown; the model
   load is timed; weight reloads come from the rollout's own ``weights_loaded`` events;
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

SPEC_OVERRIDES = {"num_steps": 12, "prompts_per_step": 4, "samples_per_prompt": 4}
"""The demo spec with fewer steps (~1 minute on 2 cores, most of it the SFT warm-up)."""
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


async def run_job(coordinator: str, spec_json: str, probe: LoadProbe | None = None,
                  timeout_s: float = 600.0) -> str:
    """Create the job, probe the machine's load until it ends; return its id."""
    from libra.clients.coordinator import GrpcCoordinatorClient

    client = GrpcCoordinatorClient(coordinator)
    job = await client.create_job(spec_json, "json")
    probing = asyncio.create_task(probe.run(job.job_id)) if probe else None
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
        if probing is not None:
            probing.cancel()
        await client.close()
    if job.state is not t.JobState.SUCCEEDED:
        raise RuntimeError(f"job {job.job_id} ended {job.state.value}: {job.message}")
    return job.job_id


def _cpu_unit() -> None:
    """A fixed piece of pure-Python work (about a millisecond on an idle core)."""
    total = 0
    for i in range(20_000):
        total += i * i
    del total


class LoadProbe:
    """Measures, while the job runs, what the co-located services experience.

    Every ``period_s``: one gateway tool call, one scheduler RPC, three Redis round
    trips (a rollout loop pass) and one fixed CPU work unit, each timed and stamped
    with the wall clock. The CPU unit's time over its time on the idle stack (measured
    by :meth:`baseline` before the job) is the slowdown a CPU-bound engine step sees
    (processor sharing with the other processes on the machine's cores).
    """

    def __init__(self, gateway: Any, scheduler: Any, redis: Any, period_s: float = 0.02) -> None:
        self.gateway, self.scheduler, self.redis = gateway, scheduler, redis
        self.period_s = period_s
        self.samples: list[tuple[float, str, float]] = []
        self.solo_cpu_s = 0.0

    def baseline(self, n: int = 200) -> None:
        times = []
        for _ in range(n):
            started = time.perf_counter()
            _cpu_unit()
            times.append(time.perf_counter() - started)
        self.solo_cpu_s = statistics.median(times)

    async def run(self, job_id: str) -> None:
        from libra import redis_keys

        n = 0
        while True:
            n += 1
            now = time.time()
            tool = _timed(self.gateway.execute(
                "probe", f"probe:{n}", "calculator", {"expression": "1+1"}, 1000, {}))
            self.samples.append((now, "tool_rpc_s", await tool))
            self.samples.append((now, "sched_rpc_s", await _timed(self.scheduler.stats(job_id))))
            started = time.perf_counter()
            await self.redis.hget(redis_keys.job(job_id), "state")
            await self.redis.hgetall(redis_keys.policy(job_id))
            await self.redis.xlen(redis_keys.trajectories(job_id))
            self.samples.append((now, "pass_s", time.perf_counter() - started))
            started = time.perf_counter()
            _cpu_unit()
            self.samples.append((now, "cpu_unit_s", time.perf_counter() - started))
            await asyncio.sleep(self.period_s)

    def summary(self, start_s: float, end_s: float) -> dict[str, float]:
        """Medians over the rollout window [start_s, end_s] (wall clock)."""
        kinds: dict[str, list[float]] = {}
        for at, kind, value in self.samples:
            if start_s <= at <= end_s:
                kinds.setdefault(kind, []).append(value)
        out = {k: statistics.median(v) for k, v in kinds.items()}
        out["num_probes"] = float(len(kinds.get("cpu_unit_s", [])))
        out["cpu_slowdown"] = max(1.0, out.get("cpu_unit_s", 0.0) / self.solo_cpu_s)
        return out


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
        out[traj.trajectory_id] = await _timed(gateway.score(
            traj.trajectory_id, spec.reward.name, traj.final_text, traj.reference))
    return out


async def measure_round_trips(redis: Any, scheduler: Any, job_id: str, n: int = 50) -> dict:
    """Median scheduler RPC and median 3-Redis-round-trip loop pass."""
    from libra import redis_keys

    sched, passes = [], []
    for _ in range(n):
        sched.append(await _timed(scheduler.stats(job_id)))
        started = time.perf_counter()
        await redis.hget(redis_keys.job(job_id), "state")
        await redis.hgetall(redis_keys.policy(job_id))
        await redis.xlen(redis_keys.trajectories(job_id))
        passes.append(time.perf_counter() - started)
    return {"tool_report_s": statistics.median(sched), "pass_overhead_s": statistics.median(passes)}


def measure_model_load(model_dir: str) -> float:
    """A rollout's first job contact: load the model directory."""
    from libra.models.tiny import load_model_dir

    started = time.perf_counter()
    load_model_dir(model_dir)
    return time.perf_counter() - started


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


def recorded(trajs: list[t.Trajectory], tool_s: dict, score_s: dict) -> list:
    """Trace records with measured tool latencies, admission and finish times."""
    from dataclasses import replace

    from sim.cpu_replay import RecordedTrajectory
    from sim.record import from_trajectory

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


async def _run_and_measure(state: dict[str, Any], spec_json: str) -> dict[str, Any]:
    """Steps 1-3 against the live stack: the job (probed while it runs), then the idle
    re-issue of its tool calls and scoring."""
    import redis.asyncio as aioredis

    from libra.cli import stack
    from libra.clients.runner import GrpcSchedulerClient
    from libra.clients.toolgateway import GrpcToolGatewayClient
    from libra.jobspec import job_spec_from_json

    redis = aioredis.from_url(state["redis_url"], decode_responses=False)
    port = {svc["name"]: svc["port"] for svc in state["services"]}
    gateway = GrpcToolGatewayClient(f"127.0.0.1:{port['toolgateway']}")
    scheduler = GrpcSchedulerClient(f"127.0.0.1:{port['scheduler']}")
    try:
        probe = LoadProbe(gateway, scheduler, redis)
        probe.baseline()
        job_id = await run_job(stack.coordinator_address(state), spec_json, probe)
        trajs, events, job = await read_run(redis, job_id)
        spec = job_spec_from_json(job["spec_json"])
        tool_s = await measure_tool_calls(gateway, spec, trajs)
        score_s = await measure_scoring(gateway, spec, trajs)
        idle = await measure_round_trips(redis, scheduler, job_id)
    finally:
        await gateway.close()
        await scheduler.close()
        await redis.aclose()
    window = (min(tr.created_at_ms for tr in trajs) / 1000,
              max(tr.finished_at_ms for tr in trajs) / 1000)
    return {"job_id": job_id, "trajs": trajs, "events": events, "spec": spec,
            "model_dir": str(Path(job["run_dir"]) / "model"), "tool_s": tool_s,
            "score_s": score_s, "idle": idle, "loaded": probe.summary(*window)}


def under_load(m: dict[str, Any]) -> tuple[dict, dict, dict[str, float]]:
    """Per-call latencies and round trips as the loaded machine served them.

    A re-issued call's time beyond the idle median (retries, back-off: wall time, not
    CPU) is kept; the RPC itself takes the probe's loaded median.
    """
    idle, loaded = m["idle"], m["loaded"]
    calls = [x for lat in m["tool_s"].values() for x in lat] or [0.0]
    idle_rpc = statistics.median(calls)
    tool_s = {k: [loaded["tool_rpc_s"] + max(0.0, x - idle_rpc) for x in lat]
              for k, lat in m["tool_s"].items()}
    score_s = {k: (loaded["tool_rpc_s"] if v > 0 else 0.0) for k, v in m["score_s"].items()}
    rtt = {"tool_report_s": loaded.get("sched_rpc_s", idle["tool_report_s"]),
           "pass_overhead_s": loaded.get("pass_s", idle["pass_overhead_s"])}
    return tool_s, score_s, rtt


def replay_measured(m: dict[str, Any], costs: Any = None) -> dict[str, Any]:
    """Calibrate the engine (unless ``costs`` is given), build the stack model, replay."""
    from sim.cpu_engine import calibrate
    from sim.cpu_replay import CpuReplay, CpuStack

    fit_info: dict[str, Any] = {}
    if costs is None:
        costs, fit_info = calibrate(m["model_dir"])
    slowdown = m["loaded"]["cpu_slowdown"]
    tool_s, score_s, rtt = under_load(m)
    recs = recorded(m["trajs"], tool_s, score_s)
    t0_ms = min(tr.created_at_ms for tr in m["trajs"])
    publish, reload_s = reload_schedule(m["events"], t0_ms)
    spec = m["spec"]
    cpu = CpuStack(
        instances=STACK_INSTANCES, buckets=tuple(spec.layout.buckets),
        policy=spec.layout.policy, max_batch_size=MAX_BATCH_SIZE,
        max_trajectories=MAX_TRAJECTORIES, costs=costs.scaled(slowdown),
        pass_overhead_s=rtt["pass_overhead_s"], tool_report_s=rtt["tool_report_s"],
        first_load_s=measure_model_load(m["model_dir"]) * slowdown + reload_s,
        reload_s=reload_s, publish_times_s=publish,
    )
    result = compare(recs, CpuReplay(cpu, recs).run())
    result["measured_inputs"] = {
        "engine_solo": costs.to_dict(), "engine_fit": fit_info, "cpu_slowdown": slowdown,
        "loaded_probe": m["loaded"], "idle_round_trips": m["idle"],
        "first_load_s": cpu.first_load_s, "reload_s": reload_s,
        "num_weight_versions": len(publish),
        "num_tool_calls": sum(len(v) for v in tool_s.values()),
    }
    return result


def validate(run_root: Path, repo_root: Path, **overrides: Any) -> dict[str, Any]:
    """The whole procedure: `libra up` in ``run_root``, run the job, measure, replay, down."""
    from libra.cli import stack

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
