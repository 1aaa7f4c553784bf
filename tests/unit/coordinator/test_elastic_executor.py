"""ElasticExecutor: turning planner signals into lends and reclaims (the loop that feeds it
is in test_elastic_loop.py).

The rig (elastic_rig.py): ``FakeRollout`` replaces the rollout instances' gRPC clients (it
performs the role changes a real instance would, through the real
``InMemoryCoordinatorStore``, and can be told to fail or never answer); ``FakeClock``
replaces wall time. Leases, role moves and events go through the real in-memory store.
"""

from __future__ import annotations

import pytest

from libra.errors import DeadlineExceeded, Unavailable
from services.coordinator.elastic import Signal
from tests.unit.coordinator.elastic_rig import HYBRID, ROLLOUT, join, make, release


async def test_join_lends_hybrid_rollout_workers_with_the_epoch_it_saw() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    before = {x.worker_id: x.epoch for x in await rig.store.live_leases()}
    rig.executor.set_signal(join(2))
    await rig.reconcile(step=3)
    assert await rig.roles_now() == {"r0": "core-rollout", "h1": "hybrid-joining",
                                     "h2": "hybrid-joining"}
    requested = await rig.events("join_requested")
    assert {(e["worker_id"], e["epoch"], e["step"]) for e in requested} == {
        ("h1", before["h1"], 3), ("h2", before["h2"], 3)}
    assert all(e["ts_ms"] == rig.clock.now_ms() for e in requested)


async def test_each_lend_bumps_the_worker_generation() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    first = rig.executor.generation("h1")
    rig.executor.set_signal(release())
    await rig.reconcile(step=2)
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=3)
    lends = [g for kind, g in rig.rollouts["h1"].calls if kind == "lend"]
    assert lends[0] == first and lends[1] > first and rig.executor.generation("h1") == lends[1]


async def test_join_keeps_the_rollout_reserve() -> None:
    rig = await make({"h1": HYBRID, "h2": HYBRID, "h3": HYBRID}, reserve_workers=2)
    rig.executor.set_signal(join(3))
    await rig.reconcile(step=1)
    assert sorted((await rig.roles_now()).values()) == [
        "hybrid-joining", "hybrid-rollout", "hybrid-rollout"]
    (limited,) = await rig.events("join_limited")
    assert (limited["wanted"], limited["granted"]) == (3, 1)
    assert "reserve_workers=2" in limited["reason"]


async def test_plan_that_would_leave_rollout_with_no_worker_is_refused() -> None:
    rig = await make({"h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    assert await rig.roles_now() == {"h1": "hybrid-rollout"}
    (refused,) = await rig.events("join_refused")
    assert refused["reason"] == ("lending 1 worker(s) would leave 0 rollout-capable "
                                 "worker(s) (have 1, reserve_workers=1)")
    assert rig.rollouts["h1"].calls == []


async def test_release_cancels_joining_workers_before_active_ones() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    active = next(w for w, r in (await rig.roles_now()).items() if r == "hybrid-joining")
    await rig.rollouts[active].activate()
    rig.executor.set_signal(join(2))
    await rig.reconcile(step=2)  # the other one is now joining
    rig.executor.set_signal(release(desired=1))
    await rig.reconcile(step=3)
    roles = await rig.roles_now()
    assert roles[active] == "hybrid-training"
    assert sorted(roles.values()) == ["core-rollout", "hybrid-rollout", "hybrid-training"]
    (requested,) = await rig.events("release_requested")
    assert requested["role"] == "hybrid-joining" and requested["worker_id"] != active


async def test_release_to_zero_detaches_active_workers_at_a_new_generation() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    await rig.rollouts["h1"].activate()
    lent_generation = rig.executor.generation("h1")
    rig.executor.set_signal(release())
    await rig.reconcile(step=2)
    assert (await rig.roles_now())["h1"] == "hybrid-rollout"
    assert rig.rollouts["h1"].calls[-1][0] == "reclaim"
    assert rig.rollouts["h1"].calls[-1][1] > lent_generation
    assert [e["kind"] for e in await rig.events()][-3:] == ["activated", "release_requested",
                                                             "released"]


async def test_activation_is_recorded_once() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    await rig.rollouts["h1"].activate()
    await rig.reconcile(step=2)
    await rig.reconcile(step=3)
    (activated,) = await rig.events("activated")
    assert activated["epoch"] == (await rig.rollouts["h1"].lease()).epoch


async def test_join_still_joining_after_timeout_is_reclaimed() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID}, join_timeout_s=60)
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    rig.clock.advance(59)
    await rig.reconcile(step=2)
    assert (await rig.roles_now())["h1"] == "hybrid-joining"
    rig.clock.advance(1)
    await rig.reconcile(step=3)
    assert (await rig.roles_now())["h1"] == "hybrid-rollout"
    (failed,) = await rig.events("join_failed")
    assert (failed["worker_id"], failed["reason"], failed["waited_s"]) == ("h1", "timeout", 60)


@pytest.mark.parametrize("error", [Unavailable("connection refused"),
                                   DeadlineExceeded("deadline exceeded")])
async def test_lend_not_acknowledged_fails_the_join_and_rolls_back(error: Exception) -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.rollouts["h1"].lend_error = error
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    (failed,) = await rig.events("join_failed")
    assert failed["reason"].startswith("no_ack: ") and failed["worker_id"] == "h1"
    assert [kind for kind, _ in rig.rollouts["h1"].calls] == ["lend", "reclaim"]


async def test_lend_that_never_answers_is_abandoned_within_the_deadline() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.rollouts["h1"].lend_hangs = True
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)  # returns: the executor stops waiting at its deadline
    (failed,) = await rig.events("join_failed")
    assert failed["reason"].startswith("no_ack: TimeoutError")


async def test_worker_whose_join_failed_sits_out_the_plan_interval() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID}, plan_interval_steps=5)
    rig.rollouts["h1"].lend_error = Unavailable("down")
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    await rig.reconcile(step=2)
    assert [kind for kind, _ in rig.rollouts["h1"].calls] == ["lend", "reclaim"]
    await rig.reconcile(step=6)  # tried again (and fails again: lend, reclaim)
    assert [kind for kind, _ in rig.rollouts["h1"].calls] == ["lend", "reclaim"] * 2


async def test_expired_signal_releases_everything() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    rig.executor.set_signal(join(2, ttl_step=10))
    await rig.reconcile(step=5)
    await rig.reconcile(step=9)
    assert list((await rig.roles_now()).values()).count("hybrid-joining") == 2
    await rig.reconcile(step=10)
    assert list((await rig.roles_now()).values()).count("hybrid-rollout") == 2
    (expired,) = await rig.events("signal_expired")
    assert expired["ttl_step"] == 10
    assert {e["reason"] for e in await rig.events("released")} == {"signal_expired"}


async def test_hold_keeps_what_is_lent() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID, "h2": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    rig.executor.set_signal(Signal("hold", 2, 1, "hysteresis", 100))
    await rig.reconcile(step=2)
    assert list((await rig.roles_now()).values()).count("hybrid-joining") == 1


async def test_stop_releases_everything() -> None:
    rig = await make({"r0": ROLLOUT, "h1": HYBRID})
    rig.executor.set_signal(join(1))
    await rig.reconcile(step=1)
    rig.executor.stop()
    await rig.reconcile(step=1)
    assert (await rig.roles_now())["h1"] == "hybrid-rollout"
    assert (await rig.events("released"))[0]["reason"] == "job_ended"
