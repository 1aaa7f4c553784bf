"""A job started with ``algorithm.init_from`` begins from the other job's weights: the
trainer (real torch backend, in-memory store) resolves the job id under the run root at start
and publishes version 0 equal to that checkpoint's model weights."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from safetensors.torch import load_file

from libra.clock import FakeClock
from libra.models.tiny import TinyModelConfig, build_model
from libra.run_dir import CHECKPOINT_MODEL, weights_file
from libra.training.backend import TorchBackendFactory
from services.trainer.core import TrainerCore
from services.trainer.memory_store import MemoryTrainerStore
from tests.fakes.coordinator import FakeCoordinator
from tests.fixtures.checkpoints import SMALL, tiny_spec, write_job_checkpoint
from tests.waiting import wait_until

JOB = "warm-job"


async def test_version_zero_is_the_checkpoints_model_weights(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    source = write_job_checkpoint(runs / "src-job", tiny_spec(seed=7))
    spec = tiny_spec("src-job")  # model seed 0: its own initial weights differ
    store = MemoryTrainerStore()
    store.put_job(JOB, spec.to_json(), str(runs / JOB))
    core = TrainerCore(store, TorchBackendFactory(), FakeCoordinator(),
                       FakeClock(), block_ms=10)
    try:
        await core.start_job(JOB)
        await wait_until(lambda: store.policy(JOB) is not None, timeout_s=30.0)
        published = load_file(str(weights_file(runs / JOB, 0)))
        trained = load_file(str(source.path / CHECKPOINT_MODEL))
        assert published.keys() == trained.keys()
        assert all(torch.equal(published[name], trained[name]) for name in trained)
        own = build_model(TinyModelConfig(**SMALL), seed=0)  # what a plain start has
        embed = "model.embed_tokens.weight"
        assert not torch.equal(own.state_dict()[embed], published[embed])
        (event,) = [e for e in store.events(JOB) if e["kind"] == "init_from"]
        assert event["checkpoint"] == str(source.path) and event["step"] == "4"
    finally:
        await core.stop_job(JOB)
        await asyncio.wait_for(core.wait(), 10.0)
