"""An instance's placement epoch is saved before any work can be routed to it.

A tick saves the epochs it places under (``keys.placement_epochs``) before it places
anything. A report finds the snapshot stale when the loop is behind and re-reads the
leases itself; an instance that snapshot shows first could be sent a move at once,
before the next tick saved its epoch, and a scheduler restarted then would not know the
epoch that work went to it under (tests/store/test_scheduler_restart_while_down.py). The
epoch of an instance seen first is now saved before the snapshot is taken in, on either
path, while a restarted instance's new epoch still waits for its sweep. Run on both
scheduler stores (in memory, and Redis on the session's real redis-server)."""

from __future__ import annotations

from libra import types as t
from libra.clock import FakeClock
from services.scheduler.core import SchedulerCore
from tests.store import test_scheduler_store_contract as contract
from tests.store.test_scheduler_restart_epoch import SHORT, held_by, started
from tests.store.test_scheduler_store_contract import JOB, World

world = contract.world  # the fixture: both stores

OK = t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS)
STALE_S = 60.0  # past any snapshot staleness bound: the report re-reads the leases


async def running_on_ro_0(world: World) -> SchedulerCore:
    await world.lease("ro-0", t.WorkerRole.CORE_ROLLOUT, SHORT, 1)
    core = await started(world)
    await core._tick(core._jobs[JOB])  # placed on ro-0, its epoch saved
    assert await world.store.placement_epochs(JOB) == {"ro-0": 1}
    return core


async def report_with_a_stale_snapshot(core: SchedulerCore, world: World) -> None:
    clock = core._clock
    assert isinstance(clock, FakeClock)
    clock.advance(STALE_S)  # the loop is behind: no tick ran meanwhile
    traj_id = sorted(await held_by(world, "ro-0"))[0]
    await core.report_tool_return(JOB, traj_id, OK, 10)


async def test_an_instance_first_seen_by_a_report_has_its_epoch_saved_before_it_is_a_target(
        world: World) -> None:
    """Before the fix: ro-1 was a move target with only {"ro-0": 1} saved."""
    core = await running_on_ro_0(world)
    await world.lease("ro-1", t.WorkerRole.CORE_ROLLOUT, SHORT, 5)  # joins
    await report_with_a_stale_snapshot(core, world)
    assert "ro-1" in core._jobs[JOB].instances.ids  # a move may go to it now
    assert await world.store.placement_epochs(JOB) == {"ro-0": 1, "ro-1": 5}


async def test_a_report_does_not_save_a_restarted_instances_new_epoch_early(
        world: World) -> None:
    """ro-0 restarted (epoch 1 -> 2): the epoch its old work was placed under stays
    saved until the sweep that re-queues that work ended, whichever path saw it."""
    core = await running_on_ro_0(world)
    await world.lease("ro-0", t.WorkerRole.CORE_ROLLOUT, SHORT, 2)
    await report_with_a_stale_snapshot(core, world)
    run = core._jobs[JOB]
    assert "ro-0" in run.departed and "ro-0" not in run.instances.ids
    assert await world.store.placement_epochs(JOB) == {"ro-0": 1}
