"""The run view: one typed picture of a job for the live web view (``/ui``) and
``libra top`` (pure: no FastAPI, gRPC or Redis).

The coordinator builds it from what it stores (the job, its step records, counters,
events, the live leases, the other jobs) and serves it at ``GET /v1/jobs/{id}/view``;
``libra top`` builds the same view from the same data read over gRPC, with this same
function, so both show the same numbers. Codec: :func:`run_view_to_dict` (plain JSON).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import cache
from typing import Any

from libra.bottleneck import Verdict, bottleneck, phase_seconds, timed_window
from libra.job_types import Job, Lease, StepRecord
from libra.metrics import STEP_PHASES
from libra.wire.step_record import step_record_from_dict

MAX_CURVE_POINTS = 600
"""Reward points sent per view: a long run is thinned (evenly, the newest point kept) so
a poll stays small and fast (the 100 ms p99 budget of docs/observability.md)."""
MAX_EVENTS = 12
"""Newest events shown: a screen's worth."""
_EVAL_KIND = "eval"  # libra.evaluation.EVAL_EVENT (not imported: it pulls in the tasks)


@dataclass(frozen=True, slots=True)
class JobLine:
    """A job in one line (the view's job, and each job of the queue)."""

    job_id: str
    name: str
    state: str
    step: int
    target_steps: int
    """``algorithm.num_steps`` of the spec (0 when it has none)."""
    policy_version: int
    queue_position: int
    message: str


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """Mean training reward of one step."""

    step: int
    reward_mean: float


@dataclass(frozen=True, slots=True)
class EvalPoint:
    """One held-out eval round (x: the steps trained before it)."""

    step: int
    reward_mean: float
    accuracy: float


@dataclass(frozen=True, slots=True)
class PhaseLine:
    """One phase of the step time, averaged over the verdict's window."""

    phase: str
    mean_s: float
    share: float
    """Of the mean step wall time."""


@dataclass(frozen=True, slots=True)
class Throughput:
    """Trained work per second of step wall time, over the verdict's window."""

    trajectories_per_s: float
    tokens_per_s: float
    step_wall_s: float
    """Mean wall time of a step."""


@dataclass(frozen=True, slots=True)
class BucketLine:
    """Placements in one bucket: all steps, and the last step."""

    bucket: str
    placed_total: int
    placed_last_step: int
    share: float
    """Of all placements so far."""


@dataclass(frozen=True, slots=True)
class WorkerLine:
    """A live worker lease."""

    worker_id: str
    role: str
    bucket: str
    epoch: int


@dataclass(frozen=True, slots=True)
class EventLine:
    """An event of the job (elastic plans, joins, releases, failures, resumes)."""

    ts_ms: int
    kind: str
    step: int
    """0 when the event names no step (a rollout's weight load)."""
    worker_id: str
    detail: str
    count: int = 1
    """Consecutive events of this kind it stands for (the newest one is shown): a
    rollout's reloads at every publish would otherwise push the elastic events out."""


@dataclass(frozen=True, slots=True)
class Counters:
    """Trajectory accounting (docs/report.md)."""

    produced: int
    trained: int
    dropped_stale: int
    dropped_failed: int
    requeued: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class RunView:
    """Everything ``/ui`` and ``libra top`` show of one job."""

    job: JobLine
    queue: list[JobLine]
    """Jobs running or waiting, in queue order (the view's job included)."""
    counters: Counters
    reward_last: float | None
    curve: list[CurvePoint]
    evals: list[EvalPoint]
    phases: list[PhaseLine]
    throughput: Throughput
    buckets: list[BucketLine]
    migrations_total: int
    migrations_last_step: int
    workers: list[WorkerLine]
    hybrid_training: int
    hybrid_joining: int
    events: list[EventLine]
    verdict: Verdict


def job_line(job: Job) -> JobLine:
    """The one-line form of a job (``target_steps`` from its spec, 0 when absent)."""
    target = 0
    if job.spec_json:
        algorithm = json.loads(job.spec_json).get("algorithm", {})
        target = int(algorithm.get("num_steps", 0)) if isinstance(algorithm, dict) else 0
    return JobLine(job.job_id, job.name, job.state.value, job.step, target,
                   job.policy_version, job.queue_position, job.message[:200])


def build_run_view(job: Job, steps: Sequence[dict[str, Any]], counters: dict[str, int],
                   events: Sequence[dict[str, Any]], leases: Sequence[Lease],
                   jobs: Sequence[Job]) -> RunView:
    """The view of ``job`` from its stored step records (JSON objects, oldest first),
    counters, events (oldest first), the live leases and every job (for the queue)."""
    # Checked by the codec when the coordinator stored them (CoordinatorCore.report_step).
    records = [step_record_from_dict(s, is_checked=True) for s in steps]
    window = timed_window(records)
    last = records[-1] if records else None
    return RunView(
        job=job_line(job), queue=_queue(job, jobs), counters=_counters(counters),
        reward_last=last.reward_mean if last else None, curve=_curve(records),
        evals=_evals(events), phases=_phases(window), throughput=_throughput(window),
        buckets=_buckets(records),
        migrations_total=sum(r.migrations or 0 for r in records),
        migrations_last_step=(last.migrations or 0) if last else 0,
        workers=[WorkerLine(lease.worker_id, lease.role.value, lease.bucket, lease.epoch)
                 for lease in sorted(leases, key=lambda lease: lease.worker_id)],
        hybrid_training=(last.hybrid_workers or 0) if last else 0,
        hybrid_joining=(last.hybrid_joining or 0) if last else 0,
        events=_events(events), verdict=bottleneck(records))


def run_view_to_dict(view: RunView) -> dict[str, Any]:
    """The view as plain JSON types (the body of ``GET /v1/jobs/{id}/view``)."""
    return _plain(view)


def _plain(value: Any) -> Any:
    # dataclasses.asdict deep-copies every leaf: half the cost of a 600-point view.
    if is_dataclass(value) and not isinstance(value, type):
        return {name: _plain(getattr(value, name)) for name in _field_names(type(value))}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _queue(job: Job, jobs: Sequence[Job]) -> list[JobLine]:
    active = {j.job_id: j for j in jobs if not j.state.is_terminal}
    # The list may be a moment older than the job read with the view: the job wins.
    active.pop(job.job_id, None)
    if not job.state.is_terminal:
        active[job.job_id] = job
    # Running first, then the queue in its order.
    ordered = sorted(active.values(), key=lambda j: (j.queue_position != 0, j.queue_position,
                                                     j.created_at_ms))
    return [job_line(j) for j in ordered]


def _counters(counters: dict[str, int]) -> Counters:
    produced = counters.get("produced", 0) + counters.get("failed", 0)
    consumed = sum(counters.get(k, 0) for k in ("trained", "dropped_stale", "dropped_failed"))
    in_flight = counters.get("in_flight_unconsumed", produced - consumed)
    return Counters(produced, counters.get("trained", 0), counters.get("dropped_stale", 0),
                    counters.get("dropped_failed", 0), counters.get("requeued", 0), in_flight)


def _curve(records: Sequence[StepRecord]) -> list[CurvePoint]:
    points = [CurvePoint(r.step, round(r.reward_mean, 4)) for r in records
              if r.reward_mean is not None]
    if len(points) <= MAX_CURVE_POINTS:
        return points
    stride = -(-len(points) // MAX_CURVE_POINTS)  # ceil: at most MAX_CURVE_POINTS kept
    return points[::-1][::stride][::-1]  # counted from the newest, so it is always kept


def _evals(events: Sequence[dict[str, Any]]) -> list[EvalPoint]:
    by_round: dict[int, EvalPoint] = {}
    for event in events:
        if event.get("kind") == _EVAL_KIND and "record" in event:
            record = json.loads(event["record"])
            # A round recorded twice (a restarted trainer): the later record wins.
            by_round[int(record["eval_round"])] = EvalPoint(
                int(record["step"]), float(record["reward_mean"]), float(record["accuracy"]))
    return [by_round[r] for r in sorted(by_round)]


def _phases(window: Sequence[StepRecord]) -> list[PhaseLine]:
    if not window:
        return []
    wall_s = _mean_wall_s(window)
    out = []
    for phase in STEP_PHASES:
        mean_s = sum(phase_seconds(r).get(phase, 0.0) for r in window) / len(window)
        out.append(PhaseLine(phase, round(mean_s, 4),
                             round(mean_s / wall_s, 4) if wall_s > 0 else 0.0))
    return out


def _mean_wall_s(window: Sequence[StepRecord]) -> float:
    return sum(max(r.wall_s or 0.0, sum(phase_seconds(r).values()))
               for r in window) / len(window)


def _throughput(window: Sequence[StepRecord]) -> Throughput:
    if not window:
        return Throughput(0.0, 0.0, 0.0)
    wall_s = _mean_wall_s(window) * len(window)
    trajectories = sum(r.num_trajectories or 0 for r in window)
    tokens = sum((r.num_trajectories or 0) * (r.tokens_mean or 0.0) for r in window)
    if wall_s <= 0:
        return Throughput(0.0, 0.0, 0.0)
    return Throughput(round(trajectories / wall_s, 3), round(tokens / wall_s, 1),
                      round(wall_s / len(window), 4))


def _buckets(records: Sequence[StepRecord]) -> list[BucketLine]:
    totals: dict[str, int] = {}
    for record in records:
        for bucket, count in (record.bucket_occupancy or {}).items():
            totals[bucket] = totals.get(bucket, 0) + count
    last = (records[-1].bucket_occupancy or {}) if records else {}
    placed = sum(totals.values())
    return [BucketLine(bucket, count, last.get(bucket, 0),
                       round(count / placed, 4) if placed else 0.0)
            for bucket, count in sorted(totals.items())]


def _events(events: Sequence[dict[str, Any]]) -> list[EventLine]:
    lines: list[EventLine] = []
    for e in events:
        if e.get("kind") == _EVAL_KIND:
            continue
        line = EventLine(_int(e.get("ts_ms")), str(e.get("kind", "")), _int(e.get("step")),
                         str(e.get("worker_id", "") or ""), _detail(e))
        if lines and lines[-1].kind == line.kind:
            line = replace(line, count=lines[-1].count + 1)
            lines[-1] = line
        else:
            lines.append(line)
    return lines[-MAX_EVENTS:]


def _int(value: Any) -> int:
    # Events written by other services carry flat string fields ("3"); a field that is
    # not a number shows as 0 rather than failing the whole view.
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _detail(event: dict[str, Any]) -> str:
    skip = {"ts_ms", "kind", "step", "worker_id", "id"}
    # epoch 0 is "no lease involved" (plans); an empty field says nothing.
    parts = [f"{k}={v}" for k, v in event.items()
             if k not in skip and v not in ("", None) and not (k == "epoch" and not v)]
    return " ".join(parts)[:160]
