"""The rollout loop's own costs, taken from the instance's in-run loop profile.

``GetInstanceStatus.loop_profile_json`` (``services/rollout/profile.py``) reports every
loop pass that ran an engine call, split into phases, and every awaited operation of a
trajectory's task as the task saw it. This module turns one instance's profile into the
replay's loop inputs (:class:`LoopCosts`, means over the run's passes and tasks) and
gives the per-trajectory operation latencies (tool calls, scoring) measured in the run.

Which passes feed which mean (each phase from the passes where it is the plain cost):

- ``pull_s`` from passes that began with trajectories held (``active > 0``: the inbox
  read did not block waiting for work);
- ``refresh_s`` from passes that ran on the same policy version as the pass before
  (no weight load: first contact and reloads are separate measured inputs);
- ``prep_s``, ``dispatch_s``, ``resume_s`` and ``after_s`` from every pass;
- ``task_start_s`` from every spawned task.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class LoopCosts:
    """One instance's measured loop costs (seconds, means over the run)."""

    pass_overhead_s: float
    """Pull + refresh + prep + dispatch: from a pass's start to its engine call's start."""
    resume_s: float
    """Engine thread's return -> the event loop resumes the pass."""
    after_s: float
    """Applying a call's results and spawning its rows' tasks (per pass)."""
    task_start_s: float
    """A spawned task's wait for the event loop before it first runs."""
    num_passes: int = 0
    num_tasks: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def loop_costs(profile: dict[str, Any]) -> LoopCosts | None:
    """The replay's loop inputs from one instance's loop profile (None when empty)."""
    passes = profile.get("passes", [])
    if not passes:
        return None
    same_version = [p for prev, p in zip(passes, passes[1:], strict=False)
                    if p["version"] == prev["version"]]
    overhead = (_mean([p["pull_s"] for p in passes if p["active"] > 0])
                + _mean([p["refresh_s"] for p in same_version])
                + _mean([p["prep_s"] + p["dispatch_s"] for p in passes]))
    starts = [o["wall_s"] for o in profile.get("ops", []) if o["op"] == "task_start"]
    return LoopCosts(
        pass_overhead_s=overhead, resume_s=_mean([p["resume_s"] for p in passes]),
        after_s=_mean([p["after_s"] for p in passes]), task_start_s=_mean(starts),
        num_passes=len(passes), num_tasks=len(starts))


def op_latencies(profiles: dict[str, dict[str, Any]], op: str) -> dict[str, list[float]]:
    """Per key (trajectory id): the wall times of its ``op`` operations, in order, over
    every instance's profile."""
    rows = sorted((o["at_s"], o["key"], o["wall_s"])
                  for prof in profiles.values() for o in prof.get("ops", [])
                  if o["op"] == op and o["key"])
    out: dict[str, list[float]] = defaultdict(list)
    for _, key, wall_s in rows:
        out[key].append(wall_s)
    return dict(out)


def phase_means(profile: dict[str, Any]) -> dict[str, float]:
    """Diagnostics: the mean of every pass phase and of every operation kind."""
    passes = profile.get("passes", [])
    out = {k: _mean([p[k] for p in passes]) for k in (
        "pull_s", "refresh_s", "prep_s", "dispatch_s", "engine_s", "resume_s", "after_s")}
    ops: dict[str, list[float]] = defaultdict(list)
    for o in profile.get("ops", []):
        ops[o["op"]].append(o["wall_s"])
    out.update({f"{name}_op_s": _mean(v) for name, v in ops.items()})
    return out
