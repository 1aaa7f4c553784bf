"""``libra.step_timing.timed``: a coroutine's own steps are timed, the time the loop
spent on other tasks while it waited is not; results, errors and cancellations pass
through unchanged."""

from __future__ import annotations

import asyncio
import time

import pytest

from libra.step_timing import StepTimes, timed


def _burn_cpu_s(seconds: float) -> float:
    """Spin until this thread used ``seconds`` of CPU; returns the CPU measured."""
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass
    return time.thread_time() - began


async def test_own_steps_count_and_other_tasks_do_not() -> None:
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    burned: dict[str, float] = {}

    async def waits_then_works() -> int:
        value = await gate  # suspends: the other task runs meanwhile
        burned["own"] = _burn_cpu_s(0.02)
        await asyncio.sleep(0)  # one more suspension
        return value + 1

    async def other_task() -> None:
        burned["other"] = _burn_cpu_s(0.1)
        gate.set_result(41)

    own = StepTimes()
    other = asyncio.create_task(other_task())
    began = time.perf_counter()
    assert await timed(waits_then_works(), own) == 42
    total_wall_s = time.perf_counter() - began
    await other
    assert own.num_steps == 3  # two suspending awaits
    # The step that burned CPU is inside the measure (its interval contains it) ...
    assert own.cpu_s >= burned["own"]
    assert own.wall_s >= burned["own"]
    # ... the other task's 0.1 s is not: the coroutine's other steps are a few
    # statements, not the 80 ms between the two burns.
    assert own.cpu_s < burned["own"] + burned["other"] / 2
    assert total_wall_s - own.wall_s >= burned["other"] / 2


async def test_an_error_passes_through_and_is_still_timed() -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("bad tick")

    own = StepTimes()
    with pytest.raises(ValueError, match="bad tick"):
        await timed(fails(), own)
    assert own.num_steps == 2


async def test_a_cancellation_reaches_the_coroutine() -> None:
    cleaned: list[str] = []
    started = asyncio.Event()

    async def waits_forever() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            cleaned.append("finally")

    own = StepTimes()
    task = asyncio.create_task(timed(waits_forever(), own))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["finally"]
    assert own.num_steps == 2


async def test_a_timeout_around_it_interrupts_the_wait() -> None:
    own = StepTimes()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await timed(asyncio.Event().wait(), own)
    assert own.num_steps == 2


async def test_a_value_sent_and_a_coroutine_that_never_suspends() -> None:
    async def immediate() -> str:
        return "done"

    own = StepTimes()
    assert await timed(immediate(), own) == "done"
    assert own.num_steps == 1
