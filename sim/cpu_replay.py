"""Replay a trace recorded from the real CPU stack on simulated CPU rollout instances.

What is modelled, each piece taken from the services' code (read-only) and each cost
**measured** (``libra_cli/sim_validation.py`` says how):

- admission: the scheduler's recorded admission times are the arrivals (the trainer's
  pace, which gates admission, is an input, not a prediction); placement by the job's
  policy (``make_policy``) under the buckets' per-instance caps; what finds no capacity
  is retried on the scheduler's tick (``tick_s``);
- rollout loop (``services/rollout/core.py``): an instance pulls placed trajectories up
  to ``max_trajectories``; each loop pass costs its measured overhead (``LoopCosts``:
  inbox read, policy reads, building the batch, handing it to the engine thread) and
  samples one turn for up to ``max_batch_size`` ready trajectories in one
  turn-batched engine call (``CpuEngineCosts.call_s``); while every pinned trajectory
  waits on a tool it polls the inbox every ``poll_s``; the first job contact loads the
  model (``first_load_s``); a newly published policy is loaded at the next pass
  (``reload_s``);
- after an engine call the event loop resumes (``resume_s``), applies the results and
  spawns one task per row (``after_s``, the rows in batch order); a task waits for the
  loop (``task_start_s``), then runs its RPC: the tool call (then the trajectory is ready
  for its next turn; the scheduler report runs in the background, off the critical
  path) or the scoring RPC of a trajectory that ends with an answer, after which the
  finish is stamped. RPC latencies are those the rollout's tasks measured in the run
  (``RecordedTrajectory``), so the event loop's and the GIL's waits are in them.

Engine and loop costs are measured per instance in the run itself, so the machine's and
the process's contention enter through them. An instance without a loop profile falls
back to the idle-stack round trips (``pass_overhead_s``), starts its tasks at once and
adds one GIL switch interval (``gil_wait_s``) to an RPC answer that arrives during an
engine call. Not modelled: the abort and re-prefill of an engine call cut by a weight
update, trajectories admitted but never finished (the job ended under them).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from libra.types import Bucket, GroupId, InstanceId, InstanceLoad, PromptId, TrajectoryId
from scheduling.policy import BucketLayout, TrajectoryDescriptor, make_policy
from sim.cpu_engine import CpuEngineCosts
from sim.loop_costs import LoopCosts
from sim.trace import TraceTrajectory

ARRIVE, LOOP, STEP, CALL_DONE, RPC_DONE, TICK = range(6)
RESUME = -1  # a LOOP token: the pass that ran an engine call goes on


@dataclass(frozen=True, slots=True)
class RecordedTrajectory:
    """A trace record plus what the real run measured around it."""

    rec: TraceTrajectory
    admitted_s: float
    finished_s: float
    """Measured finish (for the comparison only; the replay never reads it)."""
    finish_overhead_s: float = 0.0
    """Scoring RPC before the finish is stamped (0 when the trajectory has no answer)."""
    # Tool-call latencies are in ``rec.turns[k].tool.latency_s``.


@dataclass(frozen=True, kw_only=True)
class CpuStack:
    """The real stack as the replay sees it; every ``*_s`` is a measurement."""

    instances: tuple[tuple[str, str], ...]
    buckets: tuple[Bucket, ...]
    policy: str
    max_batch_size: int
    max_trajectories: int
    costs: dict[str, CpuEngineCosts]
    """Per instance id: its step costs (fitted to its own in-run engine calls)."""
    pass_overhead_s: float
    """Fallback for an instance without ``loop`` costs: the idle-stack round trips."""
    first_load_s: dict[str, float]
    """Per instance id: first admission placed on it -> model and weights loaded."""
    reload_s: float
    publish_times_s: tuple[float, ...] = ()
    poll_s: float = 0.02
    tick_s: float = 0.05
    gil_wait_s: float = 0.0
    loop: dict[str, LoopCosts] = field(default_factory=dict)
    """Per instance id: its loop costs, measured in the run (``sim/loop_costs.py``)."""

    def overhead_s(self, iid: str) -> float:
        return self.loop[iid].pass_overhead_s if iid in self.loop else self.pass_overhead_s


@dataclass
class _Traj:
    rt: RecordedTrajectory
    turn: int = 0
    ready: bool = True
    finished_s: float = -1.0

    @property
    def tid(self) -> str:
        return self.rt.rec.trajectory_id

    def context_tokens(self) -> int:
        rec = self.rt.rec
        done = rec.turns[: self.turn]
        return rec.prompt_tokens + sum(
            t.output_tokens + (t.tool.payload_tokens if t.tool else 0) for t in done
        )


@dataclass
class _Inst:
    iid: str
    inbox: deque = field(default_factory=deque)
    active: list[_Traj] = field(default_factory=list)
    busy: bool = False
    """An engine call is running."""
    in_pass: bool = False
    """A loop pass is under way (overhead, engine call, applying the results)."""
    waiting: bool = False
    loaded: bool = False
    versions_loaded: int = 0
    wait_token: int = 0
    busy_s: float = 0.0
    first_arrival_s: float = -1.0


class CpuReplay:
    """One replay of recorded trajectories on a modelled CPU stack."""

    def __init__(self, stack: CpuStack, trajs: list[RecordedTrajectory]) -> None:
        self.stack = stack
        layout = BucketLayout(list(stack.buckets))
        self.policy = make_policy(stack.policy, layout)
        self.insts = {iid: _Inst(iid) for iid, _ in stack.instances}
        self.loads = [InstanceLoad(InstanceId(iid), b, 0) for iid, b in stack.instances]
        self.load_by_id = {ld.instance_id: ld for ld in self.loads}
        self.trajs = [_Traj(rt) for rt in trajs]
        self.pending: list[_Traj] = []
        self.events: list[tuple] = []
        self.seq = 0
        self.tick_armed = False

    def _push(self, when: float, kind: int, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, payload))

    def _apply(self, deltas: tuple) -> None:
        for iid, delta in deltas:
            self.load_by_id[iid].active_trajectories += delta

    # Scheduler side.

    def _place(self, t: _Traj, now: float) -> bool:
        rec = t.rt.rec
        desc = TrajectoryDescriptor(
            TrajectoryId(rec.trajectory_id), PromptId(rec.prompt_id), GroupId(rec.group_id),
            rec.prompt_tokens,
        )
        placement = self.policy.begin(desc, self.loads)
        if not placement.is_placed:
            return False
        self._apply(placement.load_deltas)
        inst = self.insts[placement.instance_id]
        if inst.first_arrival_s < 0:
            inst.first_arrival_s = now
        inst.inbox.append(t)
        if not inst.in_pass and not inst.active:
            self._push(now, LOOP, (inst.iid, None))  # blocked on its inbox: wakes at once
        return True

    def _on_arrive(self, t: _Traj, now: float) -> None:
        if self.pending or not self._place(t, now):
            self.pending.append(t)
            self._arm_tick(now)

    def _arm_tick(self, now: float) -> None:
        if not self.tick_armed:
            self.tick_armed = True
            self._push(now + self.stack.tick_s, TICK, None)

    def _on_tick(self, _payload: None, now: float) -> None:
        self.tick_armed = False
        while self.pending and self._place(self.pending[0], now):
            self.pending.pop(0)
        if self.pending:
            self._arm_tick(now)

    # Rollout side.

    def _on_loop(self, payload: tuple[str, int | None], now: float) -> None:
        iid, token = payload
        inst, s = self.insts[iid], self.stack
        if token == RESUME:
            inst.in_pass = False
        elif inst.in_pass or (token is not None and token != inst.wait_token):
            return  # mid-pass, or a poll time-out that a wakeup already ended
        inst.waiting = False
        while inst.inbox and len(inst.active) < s.max_trajectories:
            inst.active.append(inst.inbox.popleft())
        if not inst.active:
            return  # blocked on the inbox; an arrival wakes it
        t = now + s.overhead_s(iid)
        if not inst.loaded:
            inst.loaded = True
            t = max(t, inst.first_arrival_s + s.first_load_s.get(iid, 0.0))
        published = sum(1 for p in s.publish_times_s if p <= t)
        if published > inst.versions_loaded:
            inst.versions_loaded, t = published, t + s.reload_s
        inst.in_pass = True
        self._push(t, STEP, iid)

    def _on_step(self, iid: str, now: float) -> None:
        """The pass's overhead is over: like ``RolloutCore._step``, it takes what is ready
        *now* (a tool that returned during the pull and refresh joins this call)."""
        inst, s = self.insts[iid], self.stack
        batch = [a for a in inst.active if a.ready][: s.max_batch_size]
        if not batch:
            inst.in_pass, inst.waiting = False, True
            inst.wait_token += 1
            self._push(now + s.poll_s, LOOP, (iid, inst.wait_token))
            return
        call_s = s.costs[iid].call_s(
            [a.context_tokens() for a in batch],
            [a.rt.rec.turns[a.turn].output_tokens for a in batch],
        )
        for a in batch:
            a.ready = False
        inst.busy = True
        inst.busy_s += call_s
        self._push(now + call_s, CALL_DONE, (iid, batch))

    def _on_call_done(self, payload: tuple[str, list[_Traj]], now: float) -> None:
        iid, batch = payload
        loop = self.stack.loop.get(iid)
        self.insts[iid].busy = False
        for i, a in enumerate(batch):
            tool = a.rt.rec.turns[a.turn].tool
            if tool is None:  # scoring (when it has an answer), then the finish stamp
                rpcs = (a.rt.finish_overhead_s,) if a.rt.finish_overhead_s > 0 else ()
            else:  # the tool call, then ready (the scheduler report is in the background)
                rpcs = (tool.latency_s,)
            if loop is None:
                self._after_rpcs(iid, a, rpcs, now)
                continue
            started = (now + loop.resume_s + loop.after_s * (i + 1) / len(batch)
                       + loop.task_start_s)  # the row's task, spawned in batch order
            self._push(started, RPC_DONE, (iid, a, rpcs, True))
        if loop is None:
            self._on_loop((iid, RESUME), now)
        else:  # the loop resumes, applies the results, then starts its next pass
            self._push(now + loop.resume_s + loop.after_s, LOOP, (iid, RESUME))

    def _after_rpcs(self, iid: str, a: _Traj, rpcs: tuple[float, ...], now: float) -> None:
        if rpcs:
            self._push(now + rpcs[0], RPC_DONE, (iid, a, rpcs[1:], False))
        elif a.rt.rec.turns[a.turn].tool is None:
            self._finish(self.insts[iid], a, now)
        else:
            self._tool_done(iid, a, now)

    def _on_rpc_done(self, payload: tuple[str, _Traj, tuple[float, ...], bool],
                     now: float) -> None:
        """An RPC answered: its task resumes once the event loop holds the GIL. While an
        engine call runs, the engine thread holds it and the loop waits one switch
        interval before the interpreter forces a hand-over (``gil_wait_s``)."""
        iid, a, rest, waited = payload
        if (self.insts[iid].busy and not waited and self.stack.gil_wait_s > 0
                and iid not in self.stack.loop):
            self._push(now + self.stack.gil_wait_s, RPC_DONE, (iid, a, rest, True))
            return
        self._after_rpcs(iid, a, rest, now)

    def _finish(self, inst: _Inst, a: _Traj, when: float) -> None:
        a.finished_s = when
        inst.active.remove(a)
        release = self.policy.finish(TrajectoryId(a.tid), 0)
        self._apply(release.load_deltas)
        if self.pending:
            self._arm_tick(when)

    def _tool_done(self, iid: str, a: _Traj, now: float) -> None:
        a.turn += 1
        a.ready = True
        inst = self.insts[iid]
        if inst.waiting and not inst.in_pass:
            inst.wait_token += 1  # the wakeup event ends the poll wait early
            self._push(now, LOOP, (iid, None))

    def run(self) -> list[float]:
        """Predicted finish time of every trajectory, in input order."""
        for t in self.trajs:
            self._push(t.rt.admitted_s, ARRIVE, t)
        handlers = {
            ARRIVE: self._on_arrive,
            LOOP: self._on_loop,
            STEP: self._on_step,
            CALL_DONE: self._on_call_done,
            RPC_DONE: self._on_rpc_done,
            TICK: self._on_tick,
        }
        while self.events:
            now, _, kind, payload = heapq.heappop(self.events)
            handlers[kind](payload, now)
        missing = [t.tid for t in self.trajs if t.finished_s < 0]
        if missing:
            raise RuntimeError(f"replay stalled: {len(missing)} trajectories never finished")
        return [t.finished_s for t in self.trajs]
