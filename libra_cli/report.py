"""``report.json`` and the reward curve of a job (schema: docs/report.md).

Schema (stable; later versions only add keys)::

    {"schema_version": 2, "job_id", "name", "state", "message",
     "wall_s": float, "spec": {...},
     "steps": [{"step", "wall_s", "reward_mean", "policy_version", "num_trajectories",
                "rollout_s", "train_s", "migrations", "hybrid_workers",
                "bucket_occupancy": {bucket: int}, ...}],
     "events": [{"ts_ms", "kind", "step", "worker_id", "epoch", "reason", ...}],
     "trajectories": {"produced", "trained", "dropped_stale", "dropped_failed",
                      "failed", "admitted", "requeued", "duplicate_publishes",
                      "in_flight_at_end", "running_at_end", "pending_admission_at_end",
                      "unaccounted", "accounting"},
     "reward": {"first_10pct_mean", "last_10pct_mean", "improvement"},
     "throughput": {"trajectories_per_s"},
     "storage": {"run_dir_bytes", "weights_bytes", "checkpoints_bytes", "model_bytes",
                 "other_bytes", "num_weight_versions"},
     "eval": [{"eval_round", "step", "reward_mean", "accuracy", "pass_at_k", ...}],
     "eval_trajectories": {"admitted", "produced", "failed", "consumed"}}
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from libra import types as t
from libra.evaluation import (
    EVAL_CONSUMED,
    EVAL_EVENT,
    EVAL_FAILED,
    EVAL_PRODUCED,
    EvalRecord,
)
from libra.run_dir import run_dir_usage
from libra.wire.step_record import step_record_from_dict, step_record_to_dict

# 2 added steps[].hybrid_workers and events; 3 added storage, eval, eval_trajectories
SCHEMA_VERSION = 3


# The agent endpoint's counters (in the job's counters hash).
EPISODE_COUNTERS = ("episode_splits", "episodes_timed_out", "episode_calls_aborted")


def reward_windows(steps: list[dict[str, Any]]) -> tuple[float, float]:
    """Mean reward of the first and of the last 10% of steps (at least one step each)."""
    if not steps:
        return 0.0, 0.0
    k = max(1, len(steps) // 10)
    first = [s["reward_mean"] for s in steps[:k]]
    last = [s["reward_mean"] for s in steps[-k:]]
    return sum(first) / len(first), sum(last) / len(last)


def build_report(job: t.Job, steps: Sequence[t.StepRecord | dict[str, Any]],
                 counters: dict[str, int],
                 wall_s: float, events: list[dict[str, Any]] | None = None,
                 storage: dict[str, int] | None = None) -> dict[str, Any]:
    """The report of one job; ``events`` come from the job's events stream (the eval
    rounds the trainer recorded there become ``eval``), ``storage`` from
    :func:`libra.run_dir.run_dir_usage` (measured where the report is written)."""
    records = [s if isinstance(s, t.StepRecord) else step_record_from_dict(s) for s in steps]
    # Steps recorded without elastic training had no hybrid workers.
    records = [r if r.hybrid_workers is not None else replace(r, hybrid_workers=0)
               for r in records]
    steps = [step_record_to_dict(r) for r in records]
    events = list(events or [])  # stream order: the order they were recorded
    evals = eval_entries(events)
    first, last = reward_windows(steps)
    produced = counters.get("produced", 0) + counters.get("failed", 0)
    trained = counters.get("trained", 0)
    train_wall_s = sum(r.wall_s or 0.0 for r in records)
    return {
        "schema_version": SCHEMA_VERSION, "job_id": job.job_id, "name": job.name,
        "state": job.state.value, "message": job.message, "wall_s": round(wall_s, 3),
        "spec": json.loads(job.spec_json), "steps": steps,
        "events": [e for e in events if e.get("kind") != EVAL_EVENT],
        "trajectories": {
            "produced": produced, "trained": trained,
            "dropped_stale": counters.get("dropped_stale", 0),
            "dropped_failed": counters.get("dropped_failed", 0),
            "failed": counters.get("failed", 0), "admitted": counters.get("admitted", 0),
            "requeued": counters.get("requeued", 0),
            "duplicate_publishes": counters.get("duplicate_publishes", 0),
            **_in_flight(produced, counters),
        },
        "reward": {"first_10pct_mean": round(first, 4), "last_10pct_mean": round(last, 4),
                   "improvement": round(last - first, 4)},
        "throughput": {"trajectories_per_s": round(trained / train_wall_s, 3)
                       if train_wall_s else 0.0},
        "storage": storage if storage is not None else run_dir_usage(
            Path(job.run_dir) if job.run_dir else None),
        "eval": evals,
        "eval_trajectories": eval_accounting(counters),
        # External-agent jobs (docs/agent-endpoint.md); zeros for the built-in agents.
        "episodes": {name: counters.get(name, 0) for name in EPISODE_COUNTERS},
    }


def _in_flight(produced: int, counters: dict[str, int]) -> dict[str, Any]:
    """The in-flight terms of the accounting identity, measured when the counters carry
    the queues' backlog (``in_flight_*``: the coordinator reads them from Redis).

    ``unaccounted`` = produced - (trained + dropped_stale + dropped_failed +
    in_flight_at_end): 0 when every published trajectory is trained, dropped or still
    waiting; anything else is a loss (> 0) or a double count (< 0). Without a measured
    backlog, ``in_flight_at_end`` is the difference and ``accounting`` says so.
    """
    consumed = sum(counters.get(k, 0) for k in ("trained", "dropped_stale", "dropped_failed"))
    if "in_flight_unconsumed" not in counters:
        return {"in_flight_at_end": produced - consumed, "unaccounted": 0,
                "accounting": "derived"}
    in_flight = counters["in_flight_unconsumed"]
    return {"in_flight_at_end": in_flight,
            "running_at_end": counters.get("in_flight_running", 0),
            "pending_admission_at_end": counters.get("in_flight_pending_admission", 0),
            "unaccounted": produced - consumed - in_flight, "accounting": "measured"}


def eval_entries(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The eval rounds recorded in the events stream, in round order, one per round: a
    round recorded twice (a trainer that restarted met late copies of it) keeps its
    complete record, else the one with the most samples."""
    by_round: dict[int, dict[str, Any]] = {}
    for event in events:
        if event.get("kind") == EVAL_EVENT and "record" in event:
            record = asdict(EvalRecord.from_json(event["record"]))
            held = by_round.get(record["eval_round"])
            if held is None or _fuller(record, held):
                by_round[record["eval_round"]] = record
    return [by_round[r] for r in sorted(by_round)]


def _fuller(record: dict[str, Any], than: dict[str, Any]) -> bool:
    return ((record["is_complete"], record["num_samples"])
            > (than["is_complete"], than["num_samples"]))


def eval_accounting(counters: dict[str, int]) -> dict[str, int]:
    """Eval trajectories, counted apart from training (never trained on): admitted by
    the scheduler, produced (failed included) by rollouts, consumed by the trainer."""
    produced = counters.get(EVAL_PRODUCED, 0) + counters.get(EVAL_FAILED, 0)
    return {"admitted": sum(v for k, v in counters.items() if k.startswith("eval_size:")),
            "produced": produced, "failed": counters.get(EVAL_FAILED, 0),
            "consumed": counters.get(EVAL_CONSUMED, 0)}


def write_report(report: dict[str, Any], run_dir: Path) -> tuple[Path, Path | None]:
    """Write report.json and reward_curve.png into the job's run folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "report.json"
    path.write_text(json.dumps(report, indent=2))
    return path, plot_reward_curve(report, run_dir / "reward_curve.png")


def plot_reward_curve(report: dict[str, Any], path: Path) -> Path | None:
    steps = report["steps"]
    if not steps:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [s["step"] for s in steps]
    ys = [s["reward_mean"] for s in steps]
    window = max(1, len(ys) // 10)
    smooth = [sum(ys[max(0, i - window + 1): i + 1]) / len(ys[max(0, i - window + 1): i + 1])
              for i in range(len(ys))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, ys, alpha=0.35, label="reward per step")
    ax.plot(xs, smooth, linewidth=2, label=f"moving mean ({window} steps)")
    evals = report.get("eval", [])
    if evals:  # held-out rounds on the same axes: x is the steps trained before them
        ax.plot([e["step"] for e in evals], [e["reward_mean"] for e in evals], "o-",
                color="tab:green", label="eval reward (held-out)")
        ax.plot([e["step"] for e in evals], [e["accuracy"] for e in evals], "s--",
                color="tab:red", alpha=0.7, label="eval accuracy")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{report['name']} ({report['job_id']})")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left" if evals else "lower right")  # eval points sit low early
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
