"""RolloutCore: checksummed weight loads, manifests, partial rollout across versions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from libra import types as t
from tests.fakes.engine import BlockUntilAbort
from tests.unit.rollout.rig import HERE, JOB, Rig, make_task
from tests.waiting import DEFAULT_TIMEOUT_S, wait_until

# -- weights -------------------------------------------------------------------------------

async def test_weights_are_loaded_on_first_task_after_checksum(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert rig.engine.loaded == [(str(rig.tmp / "v0.safetensors"), 0)]
    assert rig.core.policy_version == 0


async def test_bad_checksum_is_not_loaded_and_reported_once(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    await rig.write_weights(1, sha256="0" * 64)
    await wait_until(lambda: rig.events("weights_checksum_mismatch"))
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(1))
    await rig.run_until_published(2)  # many loop passes later
    (event,) = await rig.events("weights_checksum_mismatch")
    assert (event["version"], event["instance"]) == ("1", HERE)
    assert rig.engine.policy_version == 0 and [v for _, v in rig.engine.loaded] == [0]


async def test_missing_weights_file_is_reported_and_the_core_keeps_serving(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    await rig.world.set_policy(JOB, t.PolicyInfo(1, str(rig.tmp / "gone"), "ab" * 32,
                                                  str(rig.tmp / "model"), 0))
    await wait_until(lambda: rig.events("weights_checksum_mismatch"))
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(1))
    await rig.run_until_published(2)
    assert rig.engine.policy_version == 0 and not rig.task.done()


async def test_newer_policy_is_loaded_between_engine_calls(rig: Rig) -> None:
    async def publish_v1() -> None:
        await rig.write_weights(1)

    rig.tools.on_execute = publish_v1
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert rig.engine.calls == [("load", 0), ("generate", 0), ("load", 1), ("generate", 1)]
    pairs = zip(traj.token_versions, traj.loss_mask, strict=True)
    assert sorted({v for v, m in pairs if m}) == [0, 1]
    assert traj.min_version == 0


async def _interrupted_answer(rig: Rig) -> t.Trajectory:
    """``<ans>3</ans>``: its first 2 tokens sampled on v0, interrupted by v1, the rest
    (``</ans>``) on v1."""
    rig.engine.queue(BlockUntilAbort("<ans>3</ans>", keep=2), "</ans>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.engine.requests)
    await rig.write_weights(1)  # the watcher aborts the engine call in flight
    (traj,) = await rig.run_until_published()
    return traj


async def test_new_policy_interrupts_the_engine_call_in_flight(rig: Rig) -> None:
    await _interrupted_answer(rig)
    assert rig.engine.num_aborts == 1
    assert rig.engine.calls == [("load", 0), ("generate", 0), ("load", 1), ("generate", 1)]


async def test_interrupted_turn_resumes_on_new_weights_with_the_rest_of_its_budget(
        rig: Rig) -> None:
    await _interrupted_answer(rig)
    first, second = rig.engine.requests
    assert second.prompt_token_ids[len(first.prompt_token_ids):] == (
        rig.engine.tokenizer.encode("<ans>3</ans>")[:2])
    assert second.max_new_tokens == first.max_new_tokens - 2


async def test_interrupted_turn_counts_once_keeps_both_versions_and_parses_whole(
        rig: Rig) -> None:
    traj = await _interrupted_answer(rig)
    assert (traj.num_turns, traj.final_text, traj.status) == (1, "3", t.TrajectoryStatus.FINISHED)
    model_versions = [v for v, m in zip(traj.token_versions, traj.loss_mask, strict=True) if m]
    assert model_versions[:2] == [0, 0] and set(model_versions[2:]) == {1}
    assert traj.check_aligned() is None


async def _publish_manifest(rig: Rig, version: int, data: bytes) -> Path:
    from libra.weight_sync import write_manifest

    weights = rig.tmp / f"v{version:06d}.safetensors"
    weights.write_bytes(data)
    manifest, digest = write_manifest(weights, version, chunk_bytes=4)
    await rig.world.set_policy(JOB, t.PolicyInfo(version, str(manifest), digest,
                                                  str(rig.tmp / "model"), 0))
    return weights


async def test_manifest_version_is_loaded_whole_and_its_reload_time_recorded(rig: Rig) -> None:
    await _publish_manifest(rig, 1, b"weights v1 bytes")
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert rig.engine.loaded == [("weights v1 bytes", 1)]
    (event,) = await rig.events("weights_loaded")
    assert event["version"] == "1" and float(event["reload_s"]) >= 0.0


async def test_corrupt_chunk_is_an_error_event_and_the_old_weights_keep_serving(
        rig: Rig) -> None:
    rig.tools.gate = asyncio.Event()  # hold the trajectory in its tool call
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)
    weights = await _publish_manifest(rig, 1, b"weights v1 bytes")
    weights.write_bytes(b"weights v1 bytez")  # corrupted after the manifest was written
    await wait_until(lambda: rig.events("weights_checksum_mismatch"))
    rig.tools.gate.set()
    (traj,) = await rig.run_until_published()
    (event,) = await rig.events("weights_checksum_mismatch")
    assert "chunk 3" in event["error"]
    assert rig.engine.policy_version == 0 and set(traj.token_versions) == {-1, 0}


async def test_fetch_past_the_deadline_is_an_error_event_not_a_hang(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import services.rollout.weight_loader as weight_loader

    # The read ends only when the test is done: the 50 ms deadline passes first however
    # slow the machine (a 1 s read could finish first behind a stalled event loop).
    test_done = threading.Event()
    monkeypatch.setattr(weight_loader, "read_verified",
                        lambda *_: test_done.wait(DEFAULT_TIMEOUT_S) and b"")
    rig.core.weights.load_deadline_s = 0.05
    try:
        await _publish_manifest(rig, 1, b"weights v1 bytes")
        rig.engine.queue("<ans>3</ans>")
        await rig.place(make_task())
        await rig.run_until_published()
        (event,) = await rig.events("weights_load_timeout")
        assert event["version"] == "1"
    finally:
        test_done.set()
