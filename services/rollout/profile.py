"""The rollout loop's own costs, timed in the serving process (pure: perf_counter only).

:class:`LoopProfile` keeps two bounded ring buffers, reported by
``GetInstanceStatus.loop_profile_json`` next to the engine's call log:

- **passes**: every loop pass that ran an engine call, split into its phases (seconds):
  ``pull_s`` (inbox read and accepting what it brought), ``refresh_s`` (job-state and
  policy reads, plus a weight load when one happened), ``window_s`` (held open for
  external agents' calls: services/rollout/batch_window.py), ``prep_s`` (building the
  batch's requests), ``dispatch_s`` (from handing the call to the engine thread until the
  thread starts it), ``engine_s`` (the call, timed in the engine thread),
  ``resume_s`` (from the thread's return until the event loop resumes the pass) and
  ``after_s`` (applying the results and spawning the rows' tasks); with ``active``
  (trajectories held when the pass began: 0 means its inbox read blocked), ``batch``
  and ``version`` (the policy version the call ran on);
- **ops**: each awaited RPC or Redis operation of a trajectory's task, as the task saw it
  (the answer's wait for the event loop included): ``tool`` (with its retries),
  ``score``, ``publish``, ``report`` (the background tool-return report) and
  ``task_start`` (from spawning a task until it first runs: the event loop's queue);
  each with its key (the trajectory id) where there is one.

Passes that ran no engine call (waiting on tools) are only counted. Recording is a few
``perf_counter`` reads and a deque append per pass and per operation.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LoopPass:
    """One loop pass that ran an engine call (``at_s``: wall clock when it ended)."""

    at_s: float
    active: int
    batch: int
    version: int
    pull_s: float
    refresh_s: float
    prep_s: float
    dispatch_s: float
    engine_s: float
    resume_s: float
    after_s: float
    window_s: float = 0.0


@dataclass(frozen=True, slots=True)
class LoopOp:
    """One awaited operation of a task (``at_s``: wall clock when it returned)."""

    op: str
    at_s: float
    wall_s: float
    key: str = ""


class LoopProfile:
    """Bounded timing of the rollout loop; one instance per ``RolloutCore``."""

    def __init__(self, maxlen: int = 4096) -> None:
        self._passes: deque[LoopPass] = deque(maxlen=maxlen)
        self._ops: deque[LoopOp] = deque(maxlen=2 * maxlen)
        self.idle_passes = 0
        # Engine calls by batch size since start (unbounded in time, bounded in keys by
        # the instance's max batch size): the /metrics batch-size histogram.
        self.batch_sizes: dict[int, int] = {}
        self._marks: dict[str, Any] = {}
        self._last = time.perf_counter()

    # -- a loop pass: start, phase marks, the engine call, end ---------------------------

    def start_pass(self, active: int) -> None:
        if self._marks.get("engine_s") is None and self._marks:
            self.idle_passes += 1
        self._marks = {"active": active, "engine_s": None}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        """Close the phase that ran since the previous mark (``pull``, ``refresh``)."""
        now = time.perf_counter()
        self._marks[f"{phase}_s"] = now - self._last
        self._last = now

    async def engine_call(self, engine: Any, requests: list) -> Any:
        """``engine.generate(requests)`` in a worker thread, timing the hand-overs."""
        self.mark("prep")
        version = engine.policy_version
        result, started, ended = await asyncio.to_thread(_in_thread, engine.generate, requests)
        now = time.perf_counter()
        self._marks.update(dispatch_s=started - self._last, engine_s=ended - started,
                           resume_s=now - ended, batch=len(requests), version=version)
        self._last = now
        self.batch_sizes[len(requests)] = self.batch_sizes.get(len(requests), 0) + 1
        return result

    def end_pass(self) -> None:
        """After the results were applied; records the pass if it ran an engine call."""
        m = self._marks
        if m.get("engine_s") is None:
            return
        self.mark("after")
        self._passes.append(LoopPass(
            at_s=time.time(), active=m["active"], batch=m["batch"], version=m["version"],
            pull_s=m.get("pull_s", 0.0), refresh_s=m.get("refresh_s", 0.0),
            prep_s=m["prep_s"], dispatch_s=m["dispatch_s"], engine_s=m["engine_s"],
            resume_s=m["resume_s"], after_s=m["after_s"], window_s=m.get("window_s", 0.0)))
        self._marks = {}

    # -- operations of tasks --------------------------------------------------------------

    async def timed(self, op: str, aw: Awaitable[T], key: str = "") -> T:
        """Await ``aw`` and record its wall time (also when it raises)."""
        started = time.perf_counter()
        try:
            return await aw
        finally:
            self._ops.append(LoopOp(op, time.time(), time.perf_counter() - started, key))

    def task(self, coro: Awaitable[T]) -> Awaitable[T]:
        """Wrap a coroutine about to become a task: records its start lag."""
        return self._lagged(time.perf_counter(), coro)

    async def _lagged(self, spawned: float, coro: Awaitable[T]) -> T:
        lag = time.perf_counter() - spawned
        self._ops.append(LoopOp("task_start", time.time(), lag))
        return await coro

    # -- report ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"passes": [asdict(p) for p in self._passes],
                "ops": [asdict(o) for o in self._ops], "idle_passes": self.idle_passes}

    def to_json(self) -> str:
        """``{"passes": [...], "ops": [...], "idle_passes": n}``, oldest first."""
        return json.dumps(self.to_dict(), separators=(",", ":"))


def _in_thread(fn: Callable[[Any], T], arg: Any) -> tuple[T, float, float]:
    started = time.perf_counter()
    result = fn(arg)
    return result, started, time.perf_counter()
