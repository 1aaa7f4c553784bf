"""CoordinatorCore: job lifecycle and worker leases (the trainer's reports are in
test_coordinator_reports.py).

Fakes: ``FakeRunner`` replaces the trainer and scheduler gRPC clients (it records calls
and can be told to refuse); ``FakeClock`` replaces wall time. The store is the real
``InMemoryCoordinatorStore`` and the job spec parser is real.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libra import types as t
from libra.clock import FakeClock
from libra.errors import FailedPrecondition, InvalidArgument, LeaseLost, Unavailable
from scheduling.policy import POLICY_NAMES
from services.coordinator.config import CoordinatorConfig
from services.coordinator.core import CoordinatorCore
from services.coordinator.memory_store import InMemoryCoordinatorStore
from services.coordinator.worker_registry import ttl_ms_per_worker
from tests.fakes.runner import FakeRunner

VALID_SPEC = """
name = "unit"
[algorithm]
num_steps = 3
"""




def make_core(trainer: FakeRunner | None = None, scheduler: FakeRunner | None = None,
              clock: FakeClock | None = None) -> tuple[CoordinatorCore, InMemoryCoordinatorStore,
                                                       FakeRunner, FakeRunner, FakeClock]:
    clock = clock or FakeClock()
    store = InMemoryCoordinatorStore(clock)
    trainer = trainer or FakeRunner()
    scheduler = scheduler or FakeRunner()
    core = CoordinatorCore(store, trainer, scheduler, clock, Path("/tmp/libra-test-runs"))
    return core, store, trainer, scheduler, clock


# -- create ---------------------------------------------------------------------------


async def test_valid_spec_creates_running_job_and_starts_trainer_and_scheduler() -> None:
    core, store, trainer, scheduler, _ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    assert job.state is t.JobState.RUNNING
    assert (await store.get_job(job.job_id)).state is t.JobState.RUNNING
    assert trainer.started == [job.job_id]
    assert scheduler.started == [job.job_id]
    assert job.run_dir.endswith(job.job_id)
    assert job.name == "unit"


@pytest.mark.parametrize(("spec", "field"), [
    ("name = [unclosed", "spec"),
    ("bogus = 1", "bogus"),
    ("[algorithm]\nnum_stepz = 1", "algorithm.num_stepz"),
    ("[algorithm]\nnum_steps = \"ten\"", "algorithm.num_steps"),
    ("[algorithm]\nnum_steps = 0", "algorithm.num_steps"),
    ("[algorithm]\nclip_eps = 1.5", "algorithm.clip_eps"),
    ("[tools]\nenabled = [\"rm-rf\"]", "tools.enabled"),
    ("[layout]\nbuckets = [{name = \"a\", max_tokens = 200}, {name = \"b\", max_tokens = 100}]",
     "layout.buckets"),
    ("[layout]\nbuckets = []", "layout.buckets"),
    ("[[layout.buckets]]\nname = \"a\"\nmax_tokens = 0", "layout.buckets[0].max_tokens"),
])
async def test_invalid_spec_raises_invalid_argument_naming_field_and_creates_nothing(
        spec: str, field: str) -> None:
    core, store, trainer, scheduler, _ = make_core()
    with pytest.raises(InvalidArgument) as info:
        await core.create_job(spec, "toml")
    assert info.value.field == field
    assert await store.list_jobs() == []
    assert trainer.started == [] and scheduler.started == []


async def test_a_policy_the_scheduling_registry_lacks_is_refused_listing_its_names() -> None:
    core, store, trainer, scheduler, _ = make_core()
    with pytest.raises(InvalidArgument) as info:
        await core.create_job(VALID_SPEC + '[layout]\npolicy = "fifo"\n', "toml")
    assert info.value.field == "layout.policy"
    assert "'fifo'" in info.value.reason and ", ".join(POLICY_NAMES) in info.value.reason
    assert await store.list_jobs() == [] and scheduler.started == []


async def test_a_cmlfq_rule_the_policy_lacks_is_refused_at_submit() -> None:
    core, store, *_ = make_core()
    with pytest.raises(InvalidArgument) as info:
        await core.create_job(VALID_SPEC + '[layout]\npolicy = "cmlfq"\n[layout.cmlfq]\n'
                                           'entry = "longest"\n', "toml")
    assert info.value.field == "layout.cmlfq.entry" and "predict, shortest" in info.value.reason
    assert await store.list_jobs() == []


async def test_every_registered_policy_is_accepted_at_submit() -> None:
    core, *_ = make_core()
    for name in POLICY_NAMES:
        job = await core.create_job(VALID_SPEC + f'[layout]\npolicy = "{name}"\n', "toml")
        assert job.state in (t.JobState.RUNNING, t.JobState.PENDING)


async def test_unknown_spec_format_raises_invalid_argument_on_spec_format() -> None:
    core, store, *_ = make_core()
    with pytest.raises(InvalidArgument) as info:
        await core.create_job(VALID_SPEC, "xml")
    assert info.value.field == "spec_format"
    assert await store.list_jobs() == []


@pytest.mark.parametrize("refusing", ["trainer", "scheduler"])
async def test_runner_refusing_start_deletes_job_and_propagates_error(refusing: str) -> None:
    trainer = FakeRunner(start_error=Unavailable("trainer down")
                         if refusing == "trainer" else None)
    scheduler = FakeRunner(start_error=Unavailable("scheduler down")
                           if refusing == "scheduler" else None)
    core, store, *_ = make_core(trainer, scheduler)
    with pytest.raises(Unavailable):
        await core.create_job(VALID_SPEC, "toml")
    assert await store.list_jobs() == []


async def test_scheduler_refusing_start_stops_the_already_started_trainer() -> None:
    scheduler = FakeRunner(start_error=FailedPrecondition("busy"))
    core, _, trainer, _, _ = make_core(scheduler=scheduler)
    with pytest.raises(FailedPrecondition):
        await core.create_job(VALID_SPEC, "toml")
    assert trainer.stopped == trainer.started != []


async def test_rollback_still_deletes_job_when_stop_also_fails() -> None:
    trainer = FakeRunner(stop_error=Unavailable("gone"))
    scheduler = FakeRunner(start_error=Unavailable("down"), stop_error=Unavailable("gone"))
    core, store, *_ = make_core(trainer, scheduler)
    with pytest.raises(Unavailable):
        await core.create_job(VALID_SPEC, "toml")
    assert await store.list_jobs() == []


async def test_second_job_while_one_runs_is_queued_pending_without_starting() -> None:
    core, store, trainer, _, _ = make_core()
    await core.create_job(VALID_SPEC, "toml")
    second = await core.create_job(VALID_SPEC, "toml")
    assert second.state is t.JobState.PENDING and second.queue_position == 1
    assert len(await store.list_jobs()) == 2
    assert len(trainer.started) == 1


class YieldingStore(InMemoryCoordinatorStore):
    """Suspends after reading the job list, as a networked store does."""

    async def list_jobs(self) -> list[t.Job]:
        jobs = await super().list_jobs()
        await asyncio.sleep(0)
        return jobs


async def test_concurrent_creates_start_exactly_one_job_and_queue_the_rest() -> None:
    clock = FakeClock()
    trainer = FakeRunner()
    core = CoordinatorCore(YieldingStore(clock), trainer, FakeRunner(), clock, Path("/tmp"))
    results = await asyncio.gather(*(core.create_job(VALID_SPEC, "toml") for _ in range(3)))
    await core.settle()
    assert sorted(r.state.value for r in results) == ["pending", "pending", "running"]
    assert len(trainer.started) == 1


async def test_runner_failing_with_unexpected_error_still_deletes_job() -> None:
    core, store, *_ = make_core(trainer=FakeRunner(start_error=RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        await core.create_job(VALID_SPEC, "toml")
    assert await store.list_jobs() == []


async def test_new_job_is_accepted_after_the_previous_one_is_cancelled() -> None:
    core, *_ = make_core()
    first = await core.create_job(VALID_SPEC, "toml")
    await core.cancel_job(first.job_id)
    second = await core.create_job(VALID_SPEC, "toml")
    assert second.state is t.JobState.RUNNING
    assert second.job_id != first.job_id


# -- cancel / report ------------------------------------------------------------------


async def test_cancel_marks_job_cancelled_and_stops_both_runners() -> None:
    core, store, trainer, scheduler, _ = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    cancelled = await core.cancel_job(job.job_id)
    assert cancelled.state is t.JobState.CANCELLED
    assert (await store.get_job(job.job_id)).state is t.JobState.CANCELLED
    assert trainer.stopped == [job.job_id] and scheduler.stopped == [job.job_id]


async def test_cancel_still_cancels_when_a_runner_cannot_be_reached() -> None:
    core, store, *_ = make_core(trainer=FakeRunner(stop_error=Unavailable("down")))
    job = await core.create_job(VALID_SPEC, "toml")
    await core.cancel_job(job.job_id)
    assert (await store.get_job(job.job_id)).state is t.JobState.CANCELLED


async def test_cancel_of_finished_job_is_a_no_op() -> None:
    core, store, trainer, scheduler, clock = make_core()
    job = await core.create_job(VALID_SPEC, "toml")
    await core.report_job_done(job.job_id, t.JobState.SUCCEEDED, "done")
    clock.advance(5)
    again = await core.cancel_job(job.job_id)
    assert again.state is t.JobState.SUCCEEDED
    assert again.message == "done"
    assert trainer.stopped == [] and scheduler.stopped == []


# -- leases ---------------------------------------------------------------------------


async def acquire(core: CoordinatorCore, worker_id: str = "w1", ttl_ms: int = 1000) -> t.Lease:
    return await core.acquire_lease(worker_id, t.WorkerRole.CORE_ROLLOUT, "short",
                                    "127.0.0.1:1", ttl_ms)


async def test_acquire_gives_strictly_increasing_epochs() -> None:
    core, *_ = make_core()
    epochs = [(await acquire(core, w)).epoch for w in ("w1", "w2", "w1")]
    assert epochs == sorted(epochs) and len(set(epochs)) == 3


async def test_renew_with_stale_epoch_raises_lease_lost() -> None:
    core, *_ = make_core()
    old = await acquire(core)
    await acquire(core)  # the worker re-registered: the old epoch is fenced off
    with pytest.raises(LeaseLost):
        await core.renew_lease("w1", old.epoch)


async def test_renew_extends_expiry_from_now() -> None:
    core, _, _, _, clock = make_core()
    lease = await acquire(core, ttl_ms=1000)
    clock.advance(0.6)
    renewed = await core.renew_lease("w1", lease.epoch)
    assert renewed.expires_at_ms == clock.now_ms() + 1000
    clock.advance(0.6)  # past the original expiry, within the renewed one
    assert [w.worker_id for w in await core.list_workers()] == ["w1"]


async def test_renew_after_expiry_raises_lease_lost() -> None:
    core, _, _, _, clock = make_core()
    lease = await acquire(core, ttl_ms=1000)
    clock.advance(1.001)
    with pytest.raises(LeaseLost):
        await core.renew_lease("w1", lease.epoch)


async def test_release_with_other_epoch_keeps_lease() -> None:
    core, *_ = make_core()
    lease = await acquire(core)
    await core.release_lease("w1", lease.epoch + 100)
    assert [w.epoch for w in await core.list_workers()] == [lease.epoch]


async def test_release_by_holder_removes_lease() -> None:
    core, *_ = make_core()
    lease = await acquire(core)
    await core.release_lease("w1", lease.epoch)
    assert await core.list_workers() == []


@pytest.mark.parametrize("ttl_ms", [0, 199, 600_001, -5])
async def test_bad_ttl_raises_invalid_argument_naming_ttl_ms(ttl_ms: int) -> None:
    core, *_ = make_core()
    with pytest.raises(InvalidArgument) as info:
        await acquire(core, ttl_ms=ttl_ms)
    assert info.value.field == "ttl_ms"
    assert await core.list_workers() == []


async def test_empty_worker_id_raises_invalid_argument() -> None:
    core, *_ = make_core()
    with pytest.raises(InvalidArgument) as info:
        await acquire(core, worker_id="")
    assert info.value.field == "worker_id"


async def test_list_workers_shows_only_live_leases() -> None:
    core, _, _, _, clock = make_core()
    await acquire(core, "short-lived", ttl_ms=500)
    await acquire(core, "long-lived", ttl_ms=5000)
    clock.advance(1)
    workers = await core.list_workers()
    assert [w.worker_id for w in workers] == ["long-lived"]
    assert workers[0].role is t.WorkerRole.CORE_ROLLOUT


async def test_a_renewal_budget_scales_lease_ttls_with_the_fleet() -> None:
    clock = FakeClock()
    store = InMemoryCoordinatorStore(clock)
    # 1 renewal a second: 3 s per worker (holders renew every third of their TTL).
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), clock, Path("/tmp"),
                           lease_renewals_per_s=1.0)
    first = await acquire(core, "w1", ttl_ms=1000)
    assert first.ttl_ms == 3000  # alone: 3 s, above the 1 s asked for
    assert (await acquire(core, "w2", ttl_ms=1000)).ttl_ms == 6000
    renewed = await core.renew_lease("w1", first.epoch)  # the fleet grew meanwhile
    assert renewed.ttl_ms == 6000 and renewed.expires_at_ms == clock.now_ms() + 6000
    assert (await acquire(core, "w3", ttl_ms=20_000)).ttl_ms == 20_000  # asked for more


def test_the_renewal_budget_gives_the_ttl_per_worker() -> None:
    assert ttl_ms_per_worker(0.0) == 0  # no floor
    assert ttl_ms_per_worker(250.0) == 12  # 1,000 workers: 12 s
    assert ttl_ms_per_worker(7.0) == 429  # rounded up: never above the budget
    with pytest.raises(ValueError, match="lease_renewals_per_s"):
        CoordinatorConfig(lease_renewals_per_s=-1.0)
