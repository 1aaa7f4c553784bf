"""The one registry of Prometheus metric definitions: name, kind, help, labels.

Every metric a Libra service exports is defined here once; the services get their
collector with :func:`counter`, :func:`gauge` or :func:`histogram` (created on first use
in the process's default registry, which ``libra.grpcx`` serves on ``/metrics``), and
the docs table (docs/observability.md), the shipped dashboards
(deploy/observability/grafana) and their tests read :data:`DEFINITIONS`.

Labels are bounded: a job id, a service, a method, a tool, a bucket, an instance, a
reason or a phase, each from a set fixed by the deployment or the code. Never a
trajectory, group or call id: those belong to traces.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from prometheus_client import Counter, Gauge, Histogram

Kind = Literal["counter", "gauge", "histogram"]

# Seconds buckets from a fast tool call to a slow training step.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0)
# Seconds buckets for the scheduler's control loop: its targets are a tick <= 100 ms and a
# decision <= 10 ms at p99 (docs/operations.md, scale), so the buckets resolve both.
# Between 100 ms and 1 s as fine as below it: the tick's p99 at 1,000 instances fell in
# 250-500 ms or 500-1,000 ms, which said nothing of a change within them.
CONTROL_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
                           0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
                           1.0, 2.5, 5.0)
# Policy versions a trajectory lags behind the trained policy.
STALENESS_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0)
# Sequences in one engine forward (decode batch).
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)

# Seconds buckets of one Redis round trip (a PING on the health loop: ~0.1 ms on a host).
ROUNDTRIP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                     0.1, 0.25, 1.0)

# The step phases a StepRecord times (``rollout_wait`` is ``rollout_s``, ``recompute``
# is the backend's ``recompute_s``, ``reload`` is the backend's ``reload_s`` when it
# reports one).
STEP_PHASES = ("rollout_wait", "recompute", "train", "publish", "reload")
# Trajectories the trainer acked without training on them, by reason.
DROP_REASONS = ("stale", "failed")
# What one planner pass decided: a new layout applied, a candidate found but held back
# (gain too small, or the trigger did not fire), and the elastic pool's move.
PLANNER_DECISIONS = ("applied", "held", "not_fired")
ELASTIC_ACTIONS = ("join", "release", "hold", "none")


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One exported metric. ``name`` is the family name (a counter's series end in
    ``_total``, a histogram's in ``_bucket``/``_sum``/``_count``)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    service: str
    """The service that exports it ("all" for every gRPC service)."""
    buckets: tuple[float, ...] = ()

    def series(self) -> tuple[str, ...]:
        """The sample names a scrape shows for this family."""
        if self.kind == "histogram":
            return tuple(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
        if self.kind == "counter":
            return (self.name if self.name.endswith("_total") else f"{self.name}_total",)
        return (self.name,)


DEFINITIONS: tuple[MetricDef, ...] = (
    # -- every gRPC service (libra/grpcx.py) ---------------------------------------------
    MetricDef("libra_rpc_server_total", "counter", "RPCs handled",
              ("service", "method", "code"), "all"),
    MetricDef("libra_rpc_server_seconds", "histogram", "RPC latency",
              ("service", "method"), "all"),
    MetricDef("libra_redis_roundtrip_seconds", "histogram",
              "Redis round trip (the health loop's PING, once a second)", ("service",),
              "all", ROUNDTRIP_BUCKETS),
    MetricDef("libra_trace_spans_dropped", "counter",
              "Trace spans dropped, by reason (export_failed: OTLP endpoint down or refusing)",
              ("service", "reason"), "all"),
    # -- coordinator: the job queue, and each new StepRecord it stores --------------------
    MetricDef("libra_coordinator_queued_jobs", "gauge",
              "Jobs queued PENDING, waiting for the running job to end (pending admissions)",
              (), "coordinator"),
    MetricDef("libra_job_step", "gauge", "Last training step the trainer reported",
              ("job",), "coordinator"),
    MetricDef("libra_job_policy_version", "gauge", "Policy version after the last step",
              ("job",), "coordinator"),
    MetricDef("libra_job_reward_mean", "gauge", "Mean reward of the last step's batch",
              ("job",), "coordinator"),
    MetricDef("libra_job_steps_total", "counter", "Training steps stored",
              ("job",), "coordinator"),
    MetricDef("libra_job_step_phase_seconds", "histogram",
              "Time of one training step spent in each phase "
              "(rollout_wait, recompute, train, publish, reload)",
              ("job", "phase"), "coordinator", SECONDS_BUCKETS),
    MetricDef("libra_job_step_wall_seconds", "histogram", "Wall time of one training step",
              ("job",), "coordinator", SECONDS_BUCKETS),
    MetricDef("libra_job_trajectories_trained_total", "counter",
              "Trajectories trained on", ("job",), "coordinator"),
    MetricDef("libra_job_tokens_trained_total", "counter",
              "Tokens of the trajectories trained on (mean tokens x trajectories)",
              ("job",), "coordinator"),
    MetricDef("libra_job_dropped_total", "counter",
              "Trajectories acked without training, by reason (stale, failed)",
              ("job", "reason"), "coordinator"),
    MetricDef("libra_job_migrations_total", "counter",
              "Trajectories moved between rollout instances", ("job",), "coordinator"),
    MetricDef("libra_job_bucket_placements_total", "counter",
              "Trajectories the scheduler placed in each bucket (bucket occupancy)",
              ("job", "bucket"), "coordinator"),
    MetricDef("libra_job_hybrid_workers", "gauge",
              "Rollout instances lent to training, by state (training, joining)",
              ("job", "state"), "coordinator"),
    MetricDef("libra_job_planner_decisions_total", "counter",
              "Planner passes (one per step of an elastic job), by decision (applied, "
              "held, not_fired) and elastic action (join, release, hold, none)",
              ("job", "decision", "elastic"), "coordinator"),
    MetricDef("libra_job_planner_predicted_gain_seconds", "gauge",
              "Step time the planner's last candidate layout was predicted to save "
              "(net of the transition cost; <= 0: no better layout)", ("job",),
              "coordinator"),
    # -- trainer -------------------------------------------------------------------------
    MetricDef("libra_job_eval_score", "gauge",
              "Last eval round's score on the held-out split, by measure "
              "(reward_mean, accuracy)", ("job", "measure"), "trainer"),
    MetricDef("libra_job_eval_round", "gauge", "Last eval round recorded", ("job",),
              "trainer"),
    MetricDef("libra_trainer_staleness", "histogram",
              "Policy versions a trajectory lagged the trained policy when the trainer "
              "took it", ("job",), "trainer", STALENESS_BUCKETS),
    # -- rollout (read from the core at scrape time: services/rollout/metrics.py) ---------
    MetricDef("libra_rollout_trajectories_finished", "counter",
              "Trajectories whose last turn this instance generated", ("instance",),
              "rollout"),
    MetricDef("libra_rollout_tokens_generated", "counter", "Tokens this instance generated",
              ("instance",), "rollout"),
    MetricDef("libra_rollout_active_trajectories", "gauge",
              "Trajectories this instance holds now", ("instance",), "rollout"),
    MetricDef("libra_rollout_policy_version", "gauge",
              "Policy version loaded in the engine (-1 before any job)", ("instance",),
              "rollout"),
    MetricDef("libra_rollout_role", "gauge",
              "1 for the worker role this instance's lease holds now, 0 for the others",
              ("instance", "role"), "rollout"),
    MetricDef("libra_rollout_engine_batch_size", "histogram",
              "Sequences per engine call", ("instance",), "rollout", BATCH_BUCKETS),
    MetricDef("libra_rollout_weight_reload_seconds", "histogram",
              "Time to load a published policy version into the engine (verify + swap): "
              "the step's reload phase, seen from each instance", ("instance",), "rollout",
              SECONDS_BUCKETS),
    MetricDef("libra_rollout_engine_context_tokens", "gauge",
              "Context tokens (KV positions over all sequences) the engine held at the "
              "end of its last call", ("instance",), "rollout"),
    MetricDef("libra_rollout_engine_context_limit_tokens", "gauge",
              "Context tokens the engine can hold at once (max batch size x the job's "
              "context length); 0 before a job", ("instance",), "rollout"),
    # -- scheduler -----------------------------------------------------------------------
    MetricDef("libra_scheduler_decisions_total", "counter",
              "Placement decisions at tool returns, by reason and action",
              ("reason", "action"), "scheduler"),
    MetricDef("libra_scheduler_tick_seconds", "histogram",
              "Time of one scheduler tick for one job (read, admit, place, write), wall "
              "clock: counts its Redis round trips and the reports served meanwhile", (),
              "scheduler", CONTROL_SECONDS_BUCKETS),
    MetricDef("libra_scheduler_tick_own_seconds", "histogram",
              "Wall time of one tick's own steps (not its waits, nor the reports served "
              "while it waited)", (), "scheduler", CONTROL_SECONDS_BUCKETS),
    MetricDef("libra_scheduler_tick_cpu_seconds", "histogram",
              "CPU time of one tick's own steps (its own wall time less the host's "
              "other work)", (), "scheduler", CONTROL_SECONDS_BUCKETS),
    MetricDef("libra_scheduler_decide_batch_seconds", "histogram",
              "Time to decide one batch of tool-return reports (server side, per batch)",
              (), "scheduler", CONTROL_SECONDS_BUCKETS),
    MetricDef("libra_scheduler_report_tick_wait_seconds", "histogram",
              "Time one batch of tool-return reports waited for a running tick's own "
              "steps (to its end or its next Redis await) before it was decided", (),
              "scheduler", CONTROL_SECONDS_BUCKETS),
    MetricDef("libra_scheduler_queued_trajectories", "gauge",
              "Admitted trajectories waiting for an instance (queue depth)", ("job",),
              "scheduler"),
    MetricDef("libra_scheduler_groups_drawn", "counter",
              "Prompt groups drawn for admission (admitted plus rows skipped)", ("job",),
              "scheduler"),
    MetricDef("libra_scheduler_migrations", "counter",
              "Trajectories the scheduler moved between instances", ("job",), "scheduler"),
    MetricDef("libra_scheduler_idle_instances_while_queued", "gauge",
              "Live instances holding nothing while work waited", ("job",), "scheduler"),
    MetricDef("libra_scheduler_bucket_trajectories", "gauge",
              "Trajectories the live instances of each bucket hold now (bucket occupancy)",
              ("job", "bucket"), "scheduler"),
    # -- tool gateway --------------------------------------------------------------------
    MetricDef("libra_tool_calls_total", "counter", "Tool calls finished, by tool and status",
              ("tool", "status"), "toolgateway"),
    MetricDef("libra_tool_call_seconds", "histogram", "Tool call latency, by tool",
              ("tool",), "toolgateway", SECONDS_BUCKETS),
    MetricDef("libra_tool_calls_running", "gauge", "Tool calls holding a slot now",
              ("tool",), "toolgateway"),
    MetricDef("libra_tool_calls_waiting", "gauge", "Tool calls waiting for a slot now",
              ("tool",), "toolgateway"),
    MetricDef("libra_tool_slots", "gauge", "Concurrent calls allowed per tool",
              ("tool",), "toolgateway"),
)

BY_NAME: dict[str, MetricDef] = {d.name: d for d in DEFINITIONS}
_collectors: dict[str, Counter | Gauge | Histogram] = {}


def definition(name: str) -> MetricDef:
    """The definition of ``name``; KeyError names a metric nobody defined."""
    return BY_NAME[name]


def _collector(name: str, kind: Kind) -> Counter | Gauge | Histogram:
    found = _collectors.get(name)
    if found is not None:
        return found
    d = BY_NAME[name]
    if d.kind != kind:
        raise TypeError(f"{name} is a {d.kind}, not a {kind}")
    if kind == "counter":
        made: Counter | Gauge | Histogram = Counter(d.name, d.help, list(d.labels))
    elif kind == "gauge":
        made = Gauge(d.name, d.help, list(d.labels))
    else:
        made = Histogram(d.name, d.help, list(d.labels),
                         buckets=d.buckets or Histogram.DEFAULT_BUCKETS)
    _collectors[name] = made
    return made


def counter(name: str) -> Counter:
    """The process's counter ``name`` (created from its definition on first use)."""
    made = _collector(name, "counter")
    assert isinstance(made, Counter)
    return made


def gauge(name: str) -> Gauge:
    """The process's gauge ``name`` (created from its definition on first use)."""
    made = _collector(name, "gauge")
    assert isinstance(made, Gauge)
    return made


def histogram(name: str) -> Histogram:
    """The process's histogram ``name`` (created from its definition on first use)."""
    made = _collector(name, "histogram")
    assert isinstance(made, Histogram)
    return made


def remove_job(job_id: str) -> int:
    """Drop every series of ``job_id`` this process exports (the job's run folder is
    gone: ``libra gc`` or retention), so a long-lived process does not keep exporting
    jobs nobody can look up. Returns how many label sets were removed."""
    removed = 0
    for name, made in list(_collectors.items()):
        d = BY_NAME[name]
        if not d.labels or d.labels[0] != "job":
            continue
        for labels in _label_sets(made, d):
            if labels[0] == job_id:
                made.remove(*labels)
                removed += 1
    return removed


async def prune_jobs(is_gone: Callable[[str], Awaitable[bool]]) -> list[str]:
    """Remove the series of every exported job ``is_gone`` says was deleted; returns
    their ids (the coordinator and the trainer run this on a timer)."""
    gone = [job_id for job_id in sorted(jobs_exported()) if await is_gone(job_id)]
    for job_id in gone:
        remove_job(job_id)
    return gone


def jobs_exported() -> set[str]:
    """The job ids some ``libra_job_*`` series of this process carries."""
    found: set[str] = set()
    for name, made in list(_collectors.items()):
        d = BY_NAME[name]
        if d.labels and d.labels[0] == "job":
            found |= {labels[0] for labels in _label_sets(made, d)}
    return found


def _label_sets(made: Counter | Gauge | Histogram, d: MetricDef) -> set[tuple[str, ...]]:
    """The label values of every child of ``made``, read from its public ``collect()``
    (a histogram's samples add ``le``, which is not one of the metric's labels)."""
    return {tuple(sample.labels[name] for name in d.labels)
            for family in made.collect() for sample in family.samples
            if all(name in sample.labels for name in d.labels)}


def exported_series() -> set[str]:
    """Every sample name the services can export (what a PromQL query may name)."""
    return {s for d in DEFINITIONS for s in d.series()}


def markdown_table() -> str:
    """The docs table of every metric (docs/observability.md holds it verbatim)."""
    lines = ["| Metric | Kind | Labels | Service | Meaning |", "|---|---|---|---|---|"]
    for d in DEFINITIONS:
        labels = ", ".join(f"`{label}`" for label in d.labels)
        lines.append(f"| `{d.name}` | {d.kind} | {labels} | {d.service} | {d.help} |")
    return "\n".join(lines)


if __name__ == "__main__":  # the docs table: python -m libra.metrics
    print(markdown_table())
