"""The trainer prunes published weight versions (``algorithm.keep_weight_versions``):
it keeps the newest K plus every version a live rollout instance reports, over the
in-memory store and a real file layout (fake backend only)."""

from __future__ import annotations

from libra.run_dir import published_versions
from libra.weight_sync import MANIFEST_SUFFIX
from tests.unit.trainer.trainer_rig import JOB, Rig, make_group
from tests.unit.trainer.trainer_rig import rig as rig  # noqa: F401 (the fixture)


async def _train_five_steps(rig: Rig, keep: int) -> None:
    await rig.set_spec(num_steps=5, max_staleness=10, keep_weight_versions=keep)
    await rig.write(*[traj for group in range(5) for traj in make_group(group)])
    await rig.run_job()


async def _instance_holds(rig: Rig, instance: str, loaded: int, loading: int,
                          is_live: bool = True) -> None:
    """As a rollout instance reports (services/rollout/store.py), with or without a
    live lease (the coordinator's lease hash)."""
    rig.store.set_weights_in_use(JOB, instance, loaded, loading)
    rig.store.set_lease_live(instance, is_live)


async def test_keeps_the_newest_versions_and_one_a_live_instance_holds(rig: Rig) -> None:
    await _instance_holds(rig, "ro-1", loaded=1, loading=-1)
    await _train_five_steps(rig, keep=2)
    assert sorted(published_versions(rig.tmp)) == [1, 4, 5]
    manifests = sorted(p.name for p in (rig.tmp / "weights").glob(f"*{MANIFEST_SUFFIX}"))
    assert manifests == [f"v{v:06d}.safetensors{MANIFEST_SUFFIX}" for v in (1, 4, 5)]
    pruned = [record["weights_pruned"] for _, record in rig.coordinator.steps]
    assert pruned == [0, 1, 0, 1, 1]  # v0 at step 2, v2 at 4, v3 at 5; v1 stays


async def test_a_version_being_loaded_is_kept(rig: Rig) -> None:
    await _instance_holds(rig, "ro-1", loaded=0, loading=2)
    await _train_five_steps(rig, keep=1)
    assert sorted(published_versions(rig.tmp)) == [0, 2, 5]


async def test_an_instance_without_a_live_lease_protects_nothing(rig: Rig) -> None:
    await _instance_holds(rig, "ro-dead", loaded=1, loading=-1, is_live=False)
    await _train_five_steps(rig, keep=2)
    assert sorted(published_versions(rig.tmp)) == [4, 5]


async def test_keep_zero_keeps_every_version(rig: Rig) -> None:
    await _train_five_steps(rig, keep=0)
    assert sorted(published_versions(rig.tmp)) == [0, 1, 2, 3, 4, 5]
