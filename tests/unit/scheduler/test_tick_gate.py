"""The gate between the tick and the report batches (``SchedulerCore.tick_done``, awaited
by the servicer; ``services/scheduler/tick_gate.py``): a batch that arrives while the tick
computes waits for the tick's next Redis await (its read or its write) or its end; at
most ``REPORTS_PER_TICK_AWAIT`` batches pass during one await, the oldest first. The
store holds the tick inside a call until the test lets it go, so the order of events is
forced; the loop is only yielded to, never slept on."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

from libra import types as t
from libra.clock import FakeClock
from libra.step_timing import StepTimes
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore
from services.scheduler.tick_gate import TickGate
from tests.unit.scheduler.test_scheduler_core import JOB, add_instance, add_job, make_spec

OK = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)


class HoldingStore(MemorySchedulerStore):
    """The in-memory store; a call named in ``hold`` waits for ``release[name]`` (and
    sets ``held[name]`` first)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: set[str] = set()
        self.held = collections.defaultdict(asyncio.Event)
        self.release = collections.defaultdict(asyncio.Event)

    async def _maybe_hold(self, name: str) -> None:
        if name in self.hold:
            self.held[name].set()
            await self.release[name].wait()

    async def tick_state(self, *args: object, **kwargs: object):  # noqa: ANN201
        await self._maybe_hold("tick_state")
        return await super().tick_state(*args, **kwargs)  # type: ignore[arg-type]

    async def pending(self, job_id: str) -> list[t.Trajectory]:
        await self._maybe_hold("pending")
        return await super().pending(job_id)

    async def commit_tick(self, *args: object, **kwargs: object) -> None:
        await self._maybe_hold("commit_tick")
        await super().commit_tick(*args, **kwargs)  # type: ignore[arg-type]


async def placed_core(store: MemorySchedulerStore, events: list[str]) -> tuple[SchedulerCore, str]:
    """A core whose first tick placed a group (something to report on), and whose next
    tick admits another; ``events`` gets "tick" at each tick the loop ends."""
    await add_job(store, make_spec(prompts=2, samples=2))
    await add_instance(store, "rollout-0", "short")

    def observe(_wall_s: float, _own: StepTimes) -> None:
        events.append("tick")

    core = SchedulerCore(store, FakeClock(), tick_s=3600.0, observe_tick=observe)
    await core.start_job(JOB)
    await core._tick(core._jobs[JOB])
    await store.incr_counters(JOB, trained_groups=1)  # the next tick admits a group
    return core, sorted(await store.assignments(JOB))[0]


async def report(core: SchedulerCore, traj_id: str, events: list[str],
                 name: str = "report") -> t.PlacementDecision:
    """As the servicer decides a batch: the gate first."""
    await core.tick_done()
    (decision,) = await core.report_tool_returns(
        "rollout-0", 1, [t.ToolReturnReport(JOB, traj_id, OK, 5)])
    events.append(name)
    return decision  # type: ignore[return-value]


async def yield_turns(turns: int = 20) -> None:
    """Ample turns of the loop for an unhindered report to finish."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_a_report_arriving_while_the_tick_computes_is_decided_at_its_write() -> None:
    store, events = HoldingStore(), []
    core, traj_id = await placed_core(store, events)
    core._jobs[JOB].pending = None  # the tick reads the queue: an await with the gate shut
    store.hold = {"pending", "commit_tick"}
    loop = asyncio.create_task(core.run())
    await store.held["pending"].wait()
    reporting = asyncio.create_task(report(core, traj_id, events))
    await yield_turns()
    assert events == []  # the tick's own work goes first
    store.release["pending"].set()
    await store.held["commit_tick"].wait()
    decision = await reporting  # while the write is held
    assert events == ["report"] and decision.action is t.DecisionAction.STAY
    store.release["commit_tick"].set()
    await yield_turns()
    assert events == ["report", "tick"]
    await core.drain(0.0)
    loop.cancel()


async def test_a_report_during_the_read_is_decided_and_the_tick_writes_the_same() -> None:
    async def run_tick(with_report: bool) -> tuple[MemorySchedulerStore, list[str]]:
        store, events = HoldingStore(), []
        core, traj_id = await placed_core(store, events)
        store.hold = {"tick_state"}
        loop = asyncio.create_task(core.run())
        await store.held["tick_state"].wait()
        if with_report:
            decision = await report(core, traj_id, events)  # while the read is held
            assert decision.action is t.DecisionAction.STAY
        store.release["tick_state"].set()
        await yield_turns()
        await core.drain(0.0)
        loop.cancel()
        return store, events

    alone, alone_events = await run_tick(with_report=False)
    reported, reported_events = await run_tick(with_report=True)
    assert (alone_events, reported_events) == (["tick"], ["report", "tick"])
    assert await reported.assignments(JOB) == await alone.assignments(JOB)
    assert await reported.counters(JOB) == await alone.counters(JOB)
    assert reported.load(JOB) == alone.load(JOB)


async def test_with_no_tick_running_a_report_does_not_wait() -> None:
    core = SchedulerCore(MemorySchedulerStore(), FakeClock())
    waiting = asyncio.create_task(core.tick_done())
    await asyncio.sleep(0)  # one turn of the loop: done without any tick
    assert waiting.done()


def gate_with_batches(per_await_batches: int) -> tuple[
        TickGate, list[str], Callable[[str], Awaitable[None]]]:
    """A gate, the names of the batches it let through in order, and a batch: it waits
    at the gate, then records its name."""
    gate, passed = TickGate(per_await_batches), []

    async def batch(name: str) -> None:
        await gate.wait()
        passed.append(name)

    return gate, passed, batch


async def test_the_gate_lets_a_bounded_number_through_per_await_oldest_first() -> None:
    gate, passed, batch = gate_with_batches(per_await_batches=2)

    gate.tick_started()
    parked = [asyncio.create_task(batch(f"parked-{i}")) for i in range(5)]
    await yield_turns()
    assert passed == []
    gate.tick_awaits()
    await yield_turns()
    assert passed == ["parked-0", "parked-1"]
    gate.tick_resumed()
    gate.tick_awaits()
    late = asyncio.create_task(batch("late"))  # behind the parked ones
    await yield_turns()
    assert passed == ["parked-0", "parked-1", "parked-2", "parked-3"]
    gate.tick_resumed()
    gate.tick_ended()
    await yield_turns()
    assert passed[4:] == ["parked-4", "late"]
    await asyncio.gather(*parked, late)


async def test_arrivals_pass_while_passes_are_left_and_a_cancelled_one_takes_none() -> None:
    gate, passed, batch = gate_with_batches(per_await_batches=2)

    gate.tick_started()
    cancelled = asyncio.create_task(batch("cancelled"))
    await yield_turns()
    cancelled.cancel()
    await yield_turns()
    gate.tick_awaits()  # the cancelled one is skipped: two passes left for arrivals
    arrivals = [asyncio.create_task(batch(f"arrival-{i}")) for i in range(3)]
    await yield_turns()
    assert passed == ["arrival-0", "arrival-1"]
    gate.tick_resumed()
    gate.tick_ended()
    await yield_turns()
    assert passed == ["arrival-0", "arrival-1", "arrival-2"]
    await asyncio.gather(*arrivals)


async def test_outside_a_tick_its_awaits_change_nothing() -> None:
    gate = TickGate(per_await_batches=0)
    gate.tick_awaits()
    gate.tick_resumed()  # a tick's body run alone (tests): the gate stays open
    await gate.wait()  # returns at once
