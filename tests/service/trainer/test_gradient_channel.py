"""The elastic gradient channel end to end in one process: the trainer's servicer on a real
gRPC server, a hybrid (``HybridJoin`` + the torch hybrid trainer) on a real client stream,
real tiny-model gradients. Checks the join without the core waiting, lockstep (bitwise
equal weights), and a hybrid that dies or hangs mid-step (slice re-assigned, no NaN)."""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from libra import types as t
from libra.clients.gradient import GrpcGradientChannel
from libra.clock import SystemClock
from libra.jobspec import AlgorithmSpec, ElasticSpec, JobSpec, ModelSpec
from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from libra.training import channel as ch
from libra.training.backend import JobBackend
from libra.training.samples import TrainSample
from libra.types import GroupId, TrajectoryId
from services.rollout.hybrid_backend import TorchHybridTrainer
from services.rollout.hybrid_join import HybridJoin
from services.trainer.elastic import GradientDomain
from services.trainer.elastic_step import ElasticTrainer
from services.trainer.servicer import GradientChannelServicer
from tests.fakes.events import EventRecorder
from tests.service.grpc_harness import serving
from tests.waiting import wait_until

JOB = "job-e"
WORKER = "rollout-1"


def spec_for_test(deadline_s: float = 20.0) -> JobSpec:
    return JobSpec(name="elastic-test", model=ModelSpec(hidden_size=32, num_layers=1,
                                                        num_heads=2, intermediate_size=64),
                   algorithm=AlgorithmSpec(sft_steps=0, learning_rate=1e-3),
                   elastic=ElasticSpec(enabled=True, gradient_deadline_s=deadline_s,
                                       lockstep_check_interval=1))


def batch(step: int, groups: int = 4, size: int = 2) -> list[TrainSample]:
    rng = random.Random(step)
    samples = []
    for g in range(groups):
        for i in range(size):
            n = rng.randint(6, 14)
            samples.append(TrainSample(
                token_ids=[rng.randint(3, 40) for _ in range(n)],
                loss_mask=[0, 0] + [1] * (n - 2), rollout_logprobs=[0.0, 0.0] + [-1.5] * (n - 2),
                advantage=rng.uniform(-1, 1), group_id=GroupId(f"s{step}g{g}"),
                trajectory_id=TrajectoryId(f"s{step}g{g}i{i}")))
    return samples


class Leases:
    """The coordinator's lease table as the core's fencing check reads it."""

    def __init__(self) -> None:
        self.lease = t.Lease(t.WorkerId(WORKER), t.WorkerRole.HYBRID_JOINING, "long", "", 5,
                             0, 3000)

    async def list_workers(self) -> list[t.Lease]:
        return [self.lease]

    async def activate(self) -> int:
        self.lease = replace(self.lease, role=t.WorkerRole.HYBRID_TRAINING,
                             epoch=self.lease.epoch + 1)
        return self.lease.epoch


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ElasticTrainer, JobBackend, Leases, EventRecorder]:
    spec = spec_for_test()
    backend = JobBackend(spec, str(tmp_path / "model"), 1)
    events, leases = EventRecorder(), Leases()
    domain = GradientDomain(SystemClock(), events)
    trainer = ElasticTrainer(spec, spec.to_json(), backend, tmp_path, domain, leases, events)
    return trainer, backend, leases, events


async def run_steps(trainer: ElasticTrainer, first: int, last: int,
                    records: list[dict[str, float]]) -> None:
    for step in range(first, last + 1):
        await trainer.boundary(step - 1, policy_version=0)
        records.append(await trainer.train(batch(step), step))
        await hybrids_caught_up(trainer, step)


async def hybrids_caught_up(trainer: ElasticTrainer, step: int) -> None:
    """The rollout wait of a real step, in which hybrids catch up: here, until every
    hybrid past its snapshot has applied ``step`` (or left). A join state advances only
    at a boundary the hybrid has caught up with; a fixed 50 ms wait fell behind a slow
    snapshot load (1 s injected: the join never activated in 10 steps)."""
    await wait_until(lambda: all(s.detached or s.base_step is None or s.applied_step >= step
                                 for s in trainer.domain.sessions.values()))


async def start_hybrid(trainer: ElasticTrainer, address: str, leases: Leases,
                       load: Any = None) -> tuple[HybridJoin, asyncio.Task]:
    """A hybrid joining ``trainer``, once connected (the next boundary offers it the
    snapshot)."""
    hello = ch.Hello(JOB, WORKER, leases.lease.epoch, 1)
    join = HybridJoin(hello, address, GrpcGradientChannel(),
                      load or (lambda snap: TorchHybridTrainer(snap, 1)), leases.activate)
    task = asyncio.create_task(join.run())
    await wait_until(lambda: WORKER in trainer.domain.sessions)
    return join, task


class Injected:
    """The hybrid's trainer with its slice computation replaced (fault injection)."""

    def __init__(self, real: Any, slice_gradient: Any) -> None:
        self._real = real
        self.slice_gradient = slice_gradient
        self.lockstep_check_interval = real.lockstep_check_interval

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def inject(join: HybridJoin, slice_gradient: Any) -> None:
    assert join._trainer is not None
    join._trainer = Injected(join._trainer, slice_gradient)  # type: ignore[assignment]


def channel_server(trainer: ElasticTrainer):
    return serving("trainer", trainer_pb2_grpc.add_GradientChannelServicer_to_server,
                   GradientChannelServicer(trainer), trainer_pb2.DESCRIPTOR,
                   "GradientChannel")


async def test_join_activates_and_weights_stay_bitwise_equal(setup) -> None:  # noqa: ANN001
    trainer, backend, leases, events = setup
    records: list[dict[str, float]] = []
    async with channel_server(trainer) as address:
        await run_steps(trainer, 1, 2, records)  # before the join
        join, task = await start_hybrid(trainer, address, leases)
        await run_steps(trainer, 3, 14, records)
        assert join.phase == "active", join.phase
        assert trainer.domain.active(), events.kinds()
        assert records[-1]["hybrid_slices"] == 1.0
        # Lockstep: the hybrid's weights equal the core's, bit for bit.
        assert join._trainer is not None
        assert join._trainer.checksum() == backend.checksum()
        assert trainer.domain.lockstep_verified >= 3
        trainer.close("test over")
        await asyncio.wait_for(task, 10)
    assert join.detach_reason == "test over"
    assert all(math.isfinite(r["loss"]) for r in records)
    assert "hybrid_activated" in events.kinds()


async def test_a_hybrid_that_dies_mid_step_loses_no_slice(setup) -> None:  # noqa: ANN001
    trainer, backend, leases, events = setup
    records: list[dict[str, float]] = []
    async with channel_server(trainer) as address:
        join, task = await start_hybrid(trainer, address, leases)
        await run_steps(trainer, 1, 10, records)
        assert join.phase == "active"

        # The hybrid's process dies while it computes its slice: its stream breaks.
        loop = asyncio.get_running_loop()

        def die(samples: Any, scale: float) -> Any:
            loop.call_soon_threadsafe(task.cancel)
            time.sleep(0.2)
            raise RuntimeError("killed")

        inject(join, die)
        await run_steps(trainer, 11, 11, records)
    record = records[-1]
    assert record["reassigned_slices"] == 1.0 and record["hybrid_slices"] == 0.0
    assert math.isfinite(record["loss"]) and record["is_skipped"] == 0.0
    assert "slice_reassigned" in events.kinds()
    assert not trainer.domain.active()


async def test_a_hung_hybrid_is_dropped_at_the_deadline(tmp_path: Path) -> None:
    spec = spec_for_test(deadline_s=0.5)
    backend = JobBackend(spec, str(tmp_path / "model"), 1)
    events, leases = EventRecorder(), Leases()
    trainer = ElasticTrainer(spec, spec.to_json(), backend, tmp_path,
                             GradientDomain(SystemClock(), events), leases, events)
    records: list[dict[str, float]] = []
    async with channel_server(trainer) as address:
        join, task = await start_hybrid(trainer, address, leases)
        await run_steps(trainer, 1, 10, records)
        assert join.phase == "active"
        real = join._trainer
        assert real is not None

        def hang(samples: Any, scale: float) -> Any:
            time.sleep(1.5)
            return real.slice_gradient(samples, scale)

        inject(join, hang)
        await run_steps(trainer, 11, 11, records)
        task.cancel()
    assert records[-1]["reassigned_slices"] == 1.0
    assert math.isfinite(records[-1]["loss"])
    assert [f["reason"] for f in events.of("slice_reassigned")] == ["deadline passed"]


async def test_fencing_detaches_a_hybrid_whose_lease_moved_on(setup) -> None:  # noqa: ANN001
    trainer, backend, leases, events = setup
    records: list[dict[str, float]] = []
    async with channel_server(trainer) as address:
        join, task = await start_hybrid(trainer, address, leases)
        await run_steps(trainer, 1, 10, records)
        assert trainer.domain.active()
        # The coordinator gave the worker back to rollout (a newer epoch): fenced off.
        leases.lease = replace(leases.lease, role=t.WorkerRole.HYBRID_ROLLOUT,
                               epoch=leases.lease.epoch + 1)
        await run_steps(trainer, 11, 11, records)
        await asyncio.wait_for(task, 10)
    assert not trainer.domain.active()
    assert records[-1]["hybrid_slices"] == 0.0 if "hybrid_slices" in records[-1] else True
    detached = events.of("hybrid_detached")
    assert detached and "hybrid-rollout" in detached[0]["reason"]
