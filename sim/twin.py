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
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

from scheduling.planner import Plan, PlannerConfig, Workload, pipeline_depth
from sim.engine import Simulator
from sim.instance import SimInfeasible
from sim.presets import ClusterSpec
from sim.systems import SystemConfig
from sim.trace import TraceTrajectory

TWIN_STEPS_PER_DEPTH = 2
"""Twin length in pipeline depths: one depth of fill, then the measured steps."""


class TwinRefiner:
    """Scores plans by simulating the last ``pipeline depth`` steps (cycled).

    Args:
        cluster: Devices and model.
        system: The system whose policy and staleness the twin uses (its planner and
            elastic pool are switched off inside the twin).
        steps_per_depth: Twin length in pipeline depths.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        system: SystemConfig,
        steps_per_depth: int = TWIN_STEPS_PER_DEPTH,
    ) -> None:
        self._cluster = cluster
        self._depth = pipeline_depth(system.staleness if system.mode == "async" else 0)
        self._system = replace(
            system,
            enable_replan=False,
            enable_elastic=False,
            planner_config=PlannerConfig(enable_online=False, enable_elastic=False),
        )
        self._steps = max(self._depth + 1, int(round(steps_per_depth * self._depth)))
        self._recent: deque[tuple[TraceTrajectory, ...]] = deque(maxlen=self._depth)
        self._cache: dict[tuple, float] = {}
        self.runs = 0

    def observe_step(self, trajectories: list[TraceTrajectory]) -> None:
        """Append one finished step's trajectories (the oldest beyond the depth drops)."""
        if trajectories:
            self._recent.append(tuple(trajectories))
            self._cache.clear()

    def trace(self) -> list[TraceTrajectory]:
        """The twin's workload: the recent steps cycled to ``steps`` steps, renumbered."""
        out: list[TraceTrajectory] = []
        recent = list(self._recent)
        for step in range(self._steps):
            for t in recent[step % len(recent)]:
                out.append(
                    replace(
                        t,
                        trajectory_id=f"twin{step}-{t.trajectory_id}",
                        group_id=f"twin{step}-{t.group_id}",
                        step=step,
                    )
                )
        return out

    def rollout_s(self, plan: Plan, work: Workload) -> float:
        """Mean step interval of ``plan`` after the fill (``inf`` if it cannot run)."""
        if not self._recent:
            return math.inf
        key = plan.key()
        if key not in self._cache:
            self._cache[key] = self._simulate(plan)
        return self._cache[key]

    def _simulate(self, plan: Plan) -> float:
        self.runs += 1
        try:
            raw = Simulator(self._cluster, self.trace(), self._system, plan, None).run()
        except SimInfeasible:
            return math.inf
        ends = [r["start_s"] + r["train_s"] for r in raw["train_log"]]
        first = self._depth - 1
        if len(ends) - 1 <= first:
            return math.inf  # too few steps trained after the fill to measure
        return (ends[-1] - ends[first]) / (len(ends) - 1 - first)


def steady_step_s(train_log: list[dict], depth: int) -> float:
    """Mean step interval of a whole run between the fill and the drain (the steps
    ``steady_throughput`` counts): where a live job of hundreds of steps runs
    (``benchmarks/bench_planner_twin.py`` compares the twin with it)."""
    ends = [r["start_s"] + r["train_s"] for r in train_log]
    first, last = depth - 1, len(ends) - 1 - depth
    if last <= first:
        raise ValueError(f"{len(ends)} steps have no step between a fill and a drain of {depth}")
    return (ends[last] - ends[first]) / (last - first)
