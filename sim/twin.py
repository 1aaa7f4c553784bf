"""The planner's twin: a candidate plan scored by simulating the recent history on it.

Issue 20 item 5: the planner must score candidate plans the way they will run. The
closed form (``RolloutCostModel.fast_makespan_s``) assumes work spreads over every
instance and divides the critical path by the pipeline depth; C-MLFQ does neither, so
it ranked plans backwards. The twin replays the job's most recent steps through the
same discrete-event engine with the **real placement policy** (``make_policy``, a fresh
instance with the system's config), the candidate's split and layout, the staleness
gate and the training time of the cost model, and returns the mean step interval after
the pipeline fill. ``PlanSearch`` calls it for its top closed-form candidates and for
the plan in force (``RolloutRefiner`` protocol), so gains are twin against twin.

What it replays (issue 20, session 14): the last ``pipeline depth`` *complete* release
steps (every trajectory finished; under streaming a consumed batch is its step's first
finishers, the shortest), with their model outputs scaled by the recent length trend
to the step being released now, since a plan runs the work to come, not the work
seen. Response lengths grow during RL (DAPO, DeepSeek-R1); replaying steps 0-4 as-is
under-predicted later steps by ~20% (session 13). The trend is a least-squares fit of
log mean post-prompt tokens over the last ``TREND_WINDOW_STEPS`` complete steps (the
reference's planner also plans from a sliding window of recent lengths); a scaled
trajectory never grows past the longest one seen, where the job's context budget binds.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import math
import multiprocessing
import pickle
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from libra.errors import InvalidArgument
from scheduling.planner import Plan, PlannerConfig, Workload, pipeline_depth
from sim.engine import Simulator
from sim.instance import SimInfeasible
from sim.presets import ClusterSpec
from sim.systems import SystemConfig
from sim.trace import TraceTrajectory
from sim.twin_slice import (
    TWIN_SLICE_NODES,
    check_slice_nodes,
    sample_step,
    slice_factor,
    sliced_run,
)

TWIN_STEPS_PER_DEPTH = 2
"""Twin length in pipeline depths: one depth of fill, then the measured steps."""
TWIN_WINDOWS = ("after_fill", "steady")
"""Which step intervals the twin measures (``TwinRefiner`` ``window``)."""
TREND_WINDOW_STEPS = 10
"""Complete release steps the length trend is fitted over (two pipeline depths at
staleness 4: long enough to average a step's noise, short enough to follow drift)."""
MIN_TREND_STEPS = 3
"""Fewer complete steps than this: no trend (a slope from two noisy means is noise)."""


class TwinRefiner:
    """Scores plans by simulating the last ``pipeline depth`` steps (cycled).

    Args:
        cluster: Devices and model.
        system: The system whose policy and staleness the twin uses (its planner and
            elastic pool are switched off inside the twin).
        steps_per_depth: Twin length in pipeline depths.
        trend: Scale the replayed outputs by the recent length trend (``False``: replay
            as observed, the twin before session 14).
        workers: Processes that score a batch of plans at once (``rollout_s_many``,
            which ``PlanSearch.search`` calls in waves of this width). Each run is the
            same deterministic simulation wherever it runs, so the scores do not depend
            on it; 1 (the default) runs everything in this process. A decision then
            takes about its slowest run instead of the sum (issue 20, session 18).
        slice_nodes: A cluster of ``k`` times this many nodes is simulated as a 1/k slice
            (``sim.twin_slice``; ``None``: always the whole fleet).
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        system: SystemConfig,
        steps_per_depth: int = TWIN_STEPS_PER_DEPTH,
        *,
        trend: bool = True,
        window: str = "steady",
        fresh_prompts: bool = True,
        workers: int = 1,
        slice_nodes: int | None = TWIN_SLICE_NODES,
    ) -> None:
        if window not in TWIN_WINDOWS:
            raise InvalidArgument(
                "window", f"must be one of {', '.join(TWIN_WINDOWS)}, got {window!r}"
            )
        self._window = window
        if not isinstance(fresh_prompts, bool):
            raise InvalidArgument(
                "fresh_prompts", f"must be True or False, got {fresh_prompts!r}"
            )
        self._fresh_prompts = fresh_prompts
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidArgument("workers", f"must be an integer >= 1, got {workers!r}")
        self.workers = workers
        self._slice_nodes = check_slice_nodes(slice_nodes)
        self._slice = (1, 1.0)
        """(slice factor, training token scale) of the trace in ``_trace``."""
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._payload: tuple[int, bytes] | None = None
        """(token, pickled cluster, system and trace) that pool tasks carry: pickled once
        per trace, unpickled once per worker (``_pool_interval_s``)."""
        self._cluster = cluster
        self._depth = pipeline_depth(system.staleness if system.mode == "async" else 0)
        self._system = replace(
            system,
            enable_replan=False,
            enable_elastic=False,
            planner_config=PlannerConfig(enable_online=False, enable_elastic=False),
        )
        self._measured = max(1, int(round((steps_per_depth - 1) * self._depth)))
        """Steps whose intervals are averaged, after one depth of fill."""
        self._steps = self._depth + self._measured
        if window == "steady":
            # One depth more is released behind the measured steps, so the pipeline is
            # as full during them as in a long run (no drain is measured).
            self._steps += self._depth
        self._recent: deque[tuple[TraceTrajectory, ...]] = deque(maxlen=self._depth)
        self._cache: dict[tuple, float] = {}
        self._trace: list[TraceTrajectory] | None = None
        """The replayed workload, shared by every candidate until the history changes
        (it does not depend on the plan); cleared with ``_cache``."""
        if not isinstance(trend, bool):
            raise InvalidArgument("trend", f"must be True or False, got {trend!r}")
        self._trend = trend
        self._means: deque[tuple[int, float]] = deque(maxlen=TREND_WINDOW_STEPS)
        """(release step, mean post-prompt tokens) of the complete steps observed."""
        self._longest_tokens = 0
        self._frontier_step: int | None = None
        self._provisional = False
        self.runs = 0

    def observe_step(
        self, trajectories: list[TraceTrajectory], *, provisional: bool = False
    ) -> None:
        """Append one complete step's trajectories (the oldest beyond the depth drops).
        A ``provisional`` entry (the preflight's startup profile) is replaced by the
        next step observed."""
        if not trajectories:
            return
        step = trajectories[0].step
        mean = sum(t.post_prompt_tokens for t in trajectories) / len(trajectories)
        if self._provisional:
            self._means.pop()
            self._recent.pop()
        self._provisional = provisional
        self._recent.append(tuple(trajectories))
        self._means.append((step, mean))
        self._longest_tokens = max(
            self._longest_tokens, max(t.total_tokens for t in trajectories)
        )
        self._forget()

    def observe_release(self, step: int) -> None:
        """The newest released step: what the trend extrapolates to."""
        if step != self._frontier_step:
            self._frontier_step = step
            if self._trend:
                self._forget()

    def _forget(self) -> None:
        """Drop the scores and the replayed trace: the history they came from changed."""
        self._cache.clear()
        self._trace = None
        self._payload = None

    def length_scale(self) -> float:
        """Output-length factor from the replayed steps to the newest released one (1.0
        without a trend, a frontier or ``MIN_TREND_STEPS`` complete steps)."""
        if not self._trend or self._frontier_step is None or len(self._means) < MIN_TREND_STEPS:
            return 1.0
        steps = np.array([s for s, _ in self._means], dtype=float)
        logs = np.log([max(m, 1.0) for _, m in self._means])
        if np.ptp(steps) == 0:
            return 1.0
        slope = float(np.polyfit(steps, logs, 1)[0])
        replayed = float(np.mean([r[0].step for r in self._recent]))
        return math.exp(slope * (self._frontier_step - replayed))

    def trace(self) -> list[TraceTrajectory]:
        """The twin's workload: the recent steps (on a large fleet, a slice of each:
        ``sim.twin_slice``), scaled to the trend, cycled to ``steps`` steps, renumbered."""
        out: list[TraceTrajectory] = []
        factor = self.length_scale()
        k = slice_factor(self._cluster.num_nodes, self._recent, self._slice_nodes)
        recent = [tuple(_scaled(t, factor, self._longest_tokens) for t in sample_step(r, k))
                  for r in self._recent]
        replayed = sum(len(r) for r in self._recent)
        self._slice = (k, replayed / sum(len(r) for r in recent))
        for step in range(self._steps):
            for t in recent[step % len(recent)]:
                out.append(
                    replace(
                        t,
                        trajectory_id=f"twin{step}-{t.trajectory_id}",
                        group_id=f"twin{step}-{t.group_id}",
                        prompt_id=f"twin{step}-{t.prompt_id}" if self._fresh_prompts
                        else t.prompt_id,
                        step=step,
                    )
                )
        return out

    def rollout_s(self, plan: Plan, work: Workload) -> float:
        """Mean step interval of ``plan`` after the fill (``inf`` if it cannot run)."""
        return self.rollout_s_many([plan], work)[0]

    def rollout_s_many(self, plans: Sequence[Plan], work: Workload) -> list[float]:
        """``rollout_s`` of each plan; those not cached run at once on up to ``workers``
        processes (the same values as one by one)."""
        if not self._recent:
            return [math.inf] * len(plans)
        missing = list({p.key(): p for p in plans if p.key() not in self._cache}.values())
        if self._trace is None and missing:
            self._trace = self.trace()
        if len(missing) > 1 and self.workers > 1:
            scores = list(self._executor().map(_pool_interval_s, self._tasks(missing)))
        else:
            scores = [interval_s(self._cluster, self._system, self._trace, p, self._run_shape())
                      for p in missing]
        self.runs += len(missing)
        for plan, score in zip(missing, scores, strict=True):
            self._cache[plan.key()] = score
        return [self._cache[p.key()] for p in plans]

    def start_workers(self) -> None:
        """Start the worker processes now, so that no decision pays for their start (a
        no-op with one worker)."""
        if self.workers > 1:
            list(self._executor().map(abs, range(self.workers)))

    def close(self) -> None:
        """Stop the worker processes, if any (the twin still scores, in this process)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=context)
        return self._pool

    def _tasks(self, plans: list[Plan]) -> list[tuple[Any, ...]]:
        if self._payload is None:
            data = (self._cluster, self._system, self._trace)
            self._payload = (next(_PAYLOAD_TOKENS), pickle.dumps(data, pickle.HIGHEST_PROTOCOL))
        token, data = self._payload
        return [(token, data, plan, self._run_shape()) for plan in plans]

    def _run_shape(self) -> tuple[int, int, bool, int, float]:
        """(fill steps, measured steps, steady window, slice factor, training token
        scale) of the trace in ``_trace``: what ``interval_s`` needs."""
        return self._depth, self._measured, self._window == "steady", *self._slice


def interval_s(
    cluster: ClusterSpec, system: SystemConfig, trace: list[TraceTrajectory], plan: Plan,
    shape: tuple[int, int, bool, int, float],
) -> float:
    """One twin run of ``plan``: the mean interval between training-step ends over the
    measured steps after the fill (``shape``: ``TwinRefiner._run_shape``; a slice factor
    above 1 runs ``plan``'s slice, ``sim.twin_slice``); ``inf`` if it cannot run or
    measure."""
    depth, measured, steady, k, token_scale = shape
    cluster, plan = sliced_run(cluster, plan, k)
    try:
        raw = Simulator(cluster, trace, system, plan, None, train_token_scale=token_scale).run(
            stop_after_steps=depth + measured if steady else None
        )
    except SimInfeasible:
        return math.inf
    ends = [r["start_s"] + r["train_s"] for r in raw["train_log"]]
    first = depth - 1
    # after_fill: to the last batch (a bounded batch may take more than one step's
    # trajectories, so a run can train fewer batches than it has steps).
    last = first + measured if steady else len(ends) - 1
    if len(ends) - 1 < last or last <= first:
        return math.inf  # too few steps trained after the fill to measure
    return (ends[last] - ends[first]) / (last - first)


_PAYLOAD_TOKENS = itertools.count()
"""Tokens of pickled twin traces (unique within the process that builds them)."""
_WORKER_PAYLOAD: tuple[int, Any] | None = None
"""A pool worker's last unpickled (token, (cluster, system, trace))."""


def _pool_interval_s(task: tuple[Any, ...]) -> float:
    """One twin run in a pool worker: the task's trace unpickled once per worker."""
    global _WORKER_PAYLOAD
    token, data, plan, shape = task
    if _WORKER_PAYLOAD is None or _WORKER_PAYLOAD[0] != token:
        _WORKER_PAYLOAD = (token, pickle.loads(data))
    cluster, system, trace = _WORKER_PAYLOAD[1]
    return interval_s(cluster, system, trace, plan, shape)


def _scaled(traj: TraceTrajectory, factor: float, cap_tokens: int) -> TraceTrajectory:
    """``traj`` with its model outputs times ``factor``, its total kept <= ``cap_tokens``
    (never below its own total: the cap only stops growth)."""
    if factor == 1.0:
        return traj
    out = traj.output_tokens
    fixed = traj.total_tokens - out
    room = max(cap_tokens, traj.total_tokens) - fixed
    factor = min(factor, room / out) if out else factor
    turns = tuple(replace(t, output_tokens=max(1, round(t.output_tokens * factor)))
                  for t in traj.turns)
    return replace(traj, turns=turns)


def steady_step_s(train_log: list[dict], depth: int) -> float:
    """Mean step interval of a whole run between the fill and the drain (the steps
    ``steady_throughput`` counts): where a live job of hundreds of steps runs
    (``benchmarks/bench_planner_twin.py`` compares the twin with it)."""
    ends = [r["start_s"] + r["train_s"] for r in train_log]
    first, last = depth - 1, len(ends) - 1 - depth
    if last <= first:
        raise ValueError(f"{len(ends)} steps have no step between a fill and a drain of {depth}")
    return (ends[last] - ends[first]) / (last - first)
