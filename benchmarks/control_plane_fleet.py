"""Synthetic rollout instances for benchmarks/bench_control_plane.py: one child process
runs many instances as asyncio tasks (its own event loop and GIL, as instances on other
hosts would have), speaking the real protocol through the real clients and store.

A process holds a slice of the instances (the configuration arrives as one JSON line
on stdin). Each instance keeps its lease - AcquireLease, then RenewLease every third of
the TTL the coordinator granted (the rollout ``LeaseKeeper``'s cadence; the coordinator
scales TTLs with the fleet) through ``GrpcCoordinatorClient``, on a thread and event
loop of their own beside the instances' work (``Leases.run`` says why); a lost lease is
acquired again and the work held is dropped (``renewals`` "batched", the default: one
RenewLeases call renews the whole slice each beat, as a host holding many leases
would). ``kill`` instances of the slice
die at the mark (they stop renewing and working, as a crashed host): their leases must
expire, and are counted apart from leases lost by live holders. In mode ``leases`` that
is all; in mode ``instances`` each also does an instance's work - take trajectories
from the inbox
  (``RedisRolloutStore.read_inbox``, a blocking XREADGROUP each), report tool returns
  on the scheduler's ``ToolReturns`` stream (``GrpcSchedulerClient``, unanswered stays
  as the rollout core sends them; a share sent as probes that wait for their answer,
  timed at the client), hand a trajectory off when the answer is a MOVE
  (``RedisRolloutStore.handoff``) and publish finished ones (``publish``, fenced).

The process prints ``{"ready": N}`` once its leases are held; then the parent writes
``mark`` (the measured window starts: counters reset) and
``stop`` (the summary is printed, one JSON line) on stdin.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis.asyncio as aioredis  # noqa: E402

from benchmarks.control_plane_leases import (  # noqa: E402
    Leases,
    instance_id,
    percentiles_ms,
)
from libra import types as t  # noqa: E402
from libra.clients.runner import GrpcSchedulerClient  # noqa: E402
from libra.errors import LibraError  # noqa: E402
from libra.gc_policy import tune_for_latency  # noqa: E402
from services.rollout.store import RedisRolloutStore  # noqa: E402

STATES = [t.ToolReturnState(tool, size, status) for tool in ("calculator", "search")
          for size in t.SizeClass for status in t.ToolStatus]
# A placed trajectory held by an instance: its inbox entry, its task, tokens so far.
Held = dict[str, tuple[str, t.Trajectory, int]]


class Control:
    """The parent's commands on stdin: ``mark`` starts the window, ``stop`` ends it."""

    def __init__(self) -> None:
        self.marked = asyncio.Event()
        self.stopped = asyncio.Event()

    async def follow(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopped.is_set():
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "mark":
                self.marked.set()
            elif line in ("stop", ""):  # "" is EOF: the parent is gone
                self.stopped.set()


async def loop_lag(control: Control, out: list[float]) -> None:
    """How late this process's work loop runs a 0.1 s timer (in the window): a report
    or a publish waits that long before it is even sent (renewals have their own loop,
    ``Leases.run``)."""
    while not control.stopped.is_set():
        began = time.perf_counter()
        await asyncio.sleep(0.1)
        if control.marked.is_set():
            out.append(time.perf_counter() - began - 0.1)


# -- instances ----------------------------------------------------------------------------

class Fleet:
    """A slice of synthetic instances sharing this process's clients."""

    def __init__(self, cfg: dict[str, Any], control: Control, leases: Leases) -> None:
        self.cfg = cfg
        self.control = control
        self.leases = leases
        leases.on_lost = self.drop
        # A blocked inbox read holds a connection per instance (redis-py's pool
        # defaults to 100), plus the publishes and handoffs in flight.
        self.redis = aioredis.from_url(cfg["redis_url"], decode_responses=False,
                                       max_connections=cfg["count"] + cfg["max_in_flight"])
        self.store = RedisRolloutStore(self.redis)
        self.schedulers = [GrpcSchedulerClient(cfg["scheduler"])
                           for _ in range(cfg["channels"])]
        self.counts = dict.fromkeys(("reports", "moves", "handoffs", "finished", "fenced",
                                     "errors", "shed"), 0)
        self.probe_s: list[float] = []
        # Failed calls by exception and message (in and before the window).
        self.error_kinds: dict[str, int] = {}
        self.held: dict[str, Held] = {}
        self.in_flight: set[asyncio.Task[None]] = set()

    def drop(self, iid: str) -> None:
        """The lease was lost: the scheduler re-places what this instance held."""
        self.held[iid].clear()

    def count(self, name: str, by: int = 1) -> None:
        if self.control.marked.is_set():
            self.counts[name] += by

    async def read_inbox(self, iid: str) -> None:
        held = self.held[iid]
        while not self.control.stopped.is_set() and not self.leases.dead(iid):
            entries = await self.store.read_inbox(iid, 256, self.cfg["block_ms"])
            for entry in entries:
                held[entry.trajectory.trajectory_id] = (entry.entry_id, entry.trajectory, 0)

    async def work(self, index: int) -> None:
        """Every period: report tool returns and finish trajectories at the set rates,
        fenced by the instance's current lease epoch."""
        iid, cfg = instance_id(index), self.cfg
        rng = random.Random(cfg["seed"] * 100_003 + index)
        held, scheduler = self.held[iid], self.schedulers[index % len(self.schedulers)]
        period_s = cfg["period_s"]
        credit = {"report": rng.random(), "finish": rng.random()}
        await asyncio.sleep(period_s * rng.random())
        while not self.control.stopped.is_set() and not self.leases.dead(iid):
            began = time.perf_counter()
            credit["report"] += cfg["reports_per_s"] * period_s
            credit["finish"] += cfg["finishes_per_s"] * period_s
            epoch = self.leases.epochs[iid]
            for name in ("report", "finish"):
                picked = rng.sample(sorted(held), min(len(held), int(credit[name])))
                credit[name] -= int(credit[name])
                for traj_id in picked:
                    if name == "report" and len(self.in_flight) >= cfg["max_in_flight"]:
                        # The scheduler is behind: a host's instances wait for their
                        # reports to go out rather than pile up unbounded tasks here (a
                        # backlog of them starved this loop's renewals for 20 s and more).
                        self.count("shed")
                        continue
                    entry_id, traj, tokens = held[traj_id]
                    tokens += rng.randint(20, 400)
                    held[traj_id] = (entry_id, traj, tokens)
                    if name == "report":
                        self.spawn(self.report(scheduler, iid, epoch, traj_id,
                                               rng.choice(STATES), rng.random()))
                    else:
                        del held[traj_id]
                        self.spawn(self.finish(iid, epoch, entry_id, traj, tokens))
            await asyncio.sleep(max(0.0, period_s - (time.perf_counter() - began)))

    def spawn(self, call: Any) -> None:
        """Run a report or a finish on its own (the loop goes on); a failure is counted."""
        task = asyncio.create_task(call)
        self.in_flight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.counts["errors"] += 1  # counted in and before the window
            # By kind and message: redis-py's TimeoutError says whether the connect or
            # the read took past its socket timeout (5 s by default since redis-py 6).
            kind = f"{type(exc).__module__}.{type(exc).__name__}: {str(exc)[:60]}"
            self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
            if self.counts["errors"] <= 3:
                print(f"instance call failed: {exc!r} {exc}", file=sys.stderr)

    async def report(self, scheduler: GrpcSchedulerClient, iid: str, epoch: int,
                     traj_id: str, state: t.ToolReturnState, draw: float) -> None:
        is_probe = draw < self.cfg["probe_share"]
        entry = self.held[iid].get(traj_id)
        if entry is None:
            return
        began = time.perf_counter()
        try:
            decision = await scheduler.report_tool_return(
                self.cfg["job_id"], traj_id, state, entry[2], iid, epoch,
                needs_answer=is_probe)
        except LibraError as exc:  # a refused batch (stale epoch) or a broken stream
            fenced = "stale lease epoch" in str(exc)
            self.count("fenced" if fenced else "errors")
            if not fenced:
                kind = f"{type(exc).__name__}: {str(exc)[:60]}"
                self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1
            return
        self.count("reports")
        if is_probe and self.control.marked.is_set():
            self.probe_s.append(time.perf_counter() - began)
        if decision.action is not t.DecisionAction.MOVE:
            return
        self.count("moves")
        entry = self.held[iid].pop(traj_id, None)
        if entry is None:  # finished meanwhile: the move never happens
            return
        entry_id, traj, _tokens = entry
        handed = await self.store.handoff(traj, iid, entry_id, decision.target_instance,
                                          decision.target_bucket, epoch)
        self.count("handoffs" if handed else "fenced")

    async def finish(self, iid: str, epoch: int, entry_id: str, traj: t.Trajectory,
                     tokens: int) -> None:
        traj.status = t.TrajectoryStatus.FINISHED
        traj.num_prompt_tokens = 0
        traj.token_ids = [1] * tokens  # the stream entry's total_tokens is their count
        published = await self.store.publish(traj, iid, entry_id, epoch)
        self.count("finished" if published else "fenced")

    async def prepare(self) -> None:
        """Every inbox's consumer group, before the lease (as ``LeaseKeeper.register``),
        and the connections the blocking inbox reads hold: opened before the leases
        exist, not in the first seconds of the leases' short first TTLs (a host's
        start-up comes before its registration too)."""
        for index in self.leases.indexes():
            self.held[instance_id(index)] = {}
            await self.store.ensure_inbox(instance_id(index))
        # 50 connects at a time (each held until all are open, or the pool would hand
        # the same 50 out again): 500 at once overflowed Redis's accept backlog on a
        # busy host, and a dropped SYN is retried after 1, 3, 7 ... s (a driver hung).
        # Every connection the pool may open: the inbox reads' and the publishes' and
        # handoffs' in flight too. Opened on demand, a burst of them in the window met
        # the same backlog, and redis-py's connect timeout (5 s) failed 141-236 calls
        # a run at 1,000 instances ("Timeout connecting to server", session 15).
        pool, held = self.redis.connection_pool, []
        total = self.cfg["count"] + self.cfg["max_in_flight"]
        for first in range(0, total, 50):
            held += await asyncio.gather(*(pool.get_connection()
                                           for _ in range(min(50, total - first))))
        for conn in held:
            await pool.release(conn)

    async def run(self) -> dict[str, Any]:
        tasks = []
        for index in self.leases.indexes():
            tasks.append(asyncio.create_task(self.read_inbox(instance_id(index))))
            tasks.append(asyncio.create_task(self.work(index)))
        await self.control.stopped.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
        for scheduler in self.schedulers:
            await scheduler.close()
        await self.redis.aclose()
        return {**self.counts, "error_kinds": self.error_kinds,
                "held": sum(len(h) for h in self.held.values()),
                "probes": len(self.probe_s), **percentiles_ms(self.probe_s)}


async def main(cfg: dict[str, Any]) -> None:
    control = Control()
    follower = asyncio.create_task(control.follow())
    leases = Leases(cfg, control)
    fleet = Fleet(cfg, control, leases) if cfg["mode"] == "instances" else None
    if fleet is not None:
        await fleet.prepare()
        main_loop = asyncio.get_running_loop()
        leases.on_lost = lambda iid: main_loop.call_soon_threadsafe(fleet.drop, iid)
    # A driver holds ~540,000 objects; its full collections took 1.5-4.5 s each at load
    # 14 (holding the GIL: no renewal ran), which no host of one instance would see.
    tune_for_latency()
    ready = threading.Event()
    renewing = asyncio.get_running_loop().run_in_executor(
        None, lambda: asyncio.run(leases.run(ready)))
    while not ready.is_set():  # a failed acquire ends the thread: raise it here
        if renewing.done():
            renewing.result()
        await asyncio.sleep(0.05)
    lag_s: list[float] = []
    lag = asyncio.create_task(loop_lag(control, lag_s))
    print(json.dumps({"ready": len(leases.epochs)}), flush=True)
    if fleet is not None:
        work = await fleet.run()
    else:
        await control.stopped.wait()
        work = {}
    await lag
    summary = {**await renewing, **work,
               **{f"loop_lag_{k}": v for k, v in percentiles_ms(lag_s).items()}}
    print(json.dumps(summary), flush=True)
    follower.cancel()


if __name__ == "__main__":
    config = json.loads(sys.stdin.readline())
    # The fleet stands in for other hosts: at the lowest priority it takes only the CPU
    # the control plane leaves (bench_control_plane.py --fleet-nice says why).
    os.nice(config.get("nice", 0))
    asyncio.run(main(config))
