"""A report batch that arrives while a tick runs waits for the tick's end
(``SchedulerCore.tick_done``, awaited by the servicer): the tick's Redis replies are then
not taken after a burst of report batches. The store pauses the tick inside its first
read, so the order of events is forced; the loop is only yielded to, never slept on."""

from __future__ import annotations

import asyncio

from libra import types as t
from libra.clock import FakeClock
from libra.step_timing import StepTimes
from services.scheduler.core import SchedulerCore
from services.scheduler.memory_store import MemorySchedulerStore
from services.scheduler.state import TickState
from tests.unit.scheduler.test_scheduler_core import JOB, add_instance, add_job, make_spec

OK = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)


class PausingStore(MemorySchedulerStore):
    """The in-memory store, whose tick read waits for ``resume`` once ``pause`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.pause, self.resume, self.paused = False, asyncio.Event(), asyncio.Event()

    async def tick_state(self, *args: object, **kwargs: object) -> TickState:
        if self.pause:
            self.paused.set()
            await self.resume.wait()
        return await super().tick_state(*args, **kwargs)  # type: ignore[arg-type]


async def test_a_report_arriving_during_a_tick_is_decided_after_it() -> None:
    store, events = PausingStore(), []
    await add_job(store, make_spec(prompts=1, samples=2))
    await add_instance(store, "rollout-0", "short")

    def observe(_wall_s: float, _own: StepTimes) -> None:
        events.append("tick")

    core = SchedulerCore(store, FakeClock(), tick_s=3600.0, observe_tick=observe)
    await core.start_job(JOB)
    await core._tick(core._jobs[JOB])  # placed: there is something to report on
    traj_id = sorted(await store.assignments(JOB))[0]
    store.pause = True
    loop = asyncio.create_task(core.run())
    await store.paused.wait()  # the tick waits for its read

    async def report() -> None:  # as the servicer decides a batch
        await core.tick_done()
        await core.report_tool_returns("rollout-0", 1, [t.ToolReturnReport(JOB, traj_id, OK, 5)])
        events.append("report")

    reporting = asyncio.create_task(report())
    for _ in range(20):  # ample turns of the loop for an unhindered report to finish
        await asyncio.sleep(0)
    assert events == []  # the report waits for the tick
    store.resume.set()
    await reporting
    assert events == ["tick", "report"]
    await core.drain(0.0)
    loop.cancel()


async def test_with_no_tick_running_a_report_does_not_wait() -> None:
    core = SchedulerCore(MemorySchedulerStore(), FakeClock())
    waiting = asyncio.create_task(core.tick_done())
    await asyncio.sleep(0)  # one turn of the loop: done without any tick
    assert waiting.done()
