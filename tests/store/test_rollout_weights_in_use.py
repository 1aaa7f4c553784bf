"""A rollout instance reports the weight versions it holds and fetches, so the trainer's
pruning (``algorithm.keep_weight_versions``) never deletes them: a slow reload keeps its
version. Real Redis (the rollout core over its Redis store): the trainer's own store
reads what the instance wrote."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from libra import redis_keys as keys
from libra.run_dir import prune_weight_versions, published_versions, weights_file
from services.trainer.store import RedisTrainerStore
from tests.unit.rollout.rig import HERE, JOB, Rig, make_task, started_rig
from tests.waiting import wait_until


@pytest.fixture
async def rig(redis_bytes: aioredis.Redis, tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, redis=redis_bytes) as rig:
        yield rig


async def in_use(rig: Rig) -> set[int]:
    return await RedisTrainerStore(rig.world.r).weights_in_use(JOB)


async def reported(rig: Rig) -> str | None:
    """What this instance last reported: "<loaded> <loading>"."""
    raw = await rig.world.r.hget(keys.weights_in_use(JOB), HERE)
    return None if raw is None else raw.decode()


async def reported_is(rig: Rig, expected: str | None) -> bool:
    return await reported(rig) == expected


def slow_reload_of(rig: Rig, version: int) -> threading.Event:
    """Make the engine's load of ``version`` wait until the returned event is set."""
    release = threading.Event()
    load = rig.engine.load_weights

    def slow_load(path: str, loaded_version: int) -> None:
        if loaded_version == version:
            release.wait(10.0)
        load(path, loaded_version)

    rig.engine.load_weights = slow_load  # type: ignore[method-assign]
    return release


def run_layout(rig: Rig, versions: range) -> None:
    for version in versions:
        path = weights_file(rig.tmp / "run", version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"w")


async def test_a_slow_reload_keeps_its_version_until_it_is_loaded(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    assert await in_use(rig) == {0}
    release = slow_reload_of(rig, 1)
    await rig.write_weights(1)
    await wait_until(lambda: reported_is(rig, "0 1"))
    # Meanwhile the trainer published up to v5 and prunes to the newest 2.
    run_layout(rig, range(6))
    pruned = prune_weight_versions(rig.tmp / "run", 2, await in_use(rig))
    assert pruned == [2, 3] and sorted(published_versions(rig.tmp / "run")) == [0, 1, 4, 5]
    release.set()
    await wait_until(lambda: reported_is(rig, "1 -1"))
    assert await in_use(rig) == {1}


async def test_an_instance_whose_lease_is_gone_protects_nothing(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    await rig.world.delete_lease(HERE)  # expired: the instance is dead
    assert await in_use(rig) == set()


async def test_an_instance_leaves_the_job_when_it_ends(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    await rig.world.set_job_state(JOB, "succeeded")
    await wait_until(lambda: reported_is(rig, None))
