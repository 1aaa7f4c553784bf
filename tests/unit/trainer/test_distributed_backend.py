"""Data-parallel trainer on CPU: 2 gloo ranks (this process + one spawned worker)."""

import math
import multiprocessing
import random

import pytest
import torch
from safetensors.torch import load_file

from libra.jobspec import AlgorithmSpec, JobSpec, ModelSpec, TaskSpec
from libra.models.tiny import build_tokenizer, encode_segments
from libra.tasks.arith import ArithDataset, demonstration
from libra.training.backend import JobBackend
from libra.training.samples import TrainSample
from services.trainer.distributed import DistributedJobBackend, state_checksum

SPEC = JobSpec(
    model=ModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    task=TaskSpec(num_prompts=16),
    algorithm=AlgorithmSpec(sft_steps=3, sft_batch_size=4, learning_rate=1e-2),
)


def _samples(count: int, nan_at: int | None = None) -> list[TrainSample]:
    tokenizer = build_tokenizer()
    rng = random.Random(1)
    samples = []
    for index, problem in enumerate(ArithDataset(0, count, max_ops=1)):
        token_ids, loss_mask = encode_segments(tokenizer, demonstration(problem, rng))
        advantage = math.nan if index == nan_at else (1.0 if index % 2 else -1.0)
        samples.append(TrainSample(
            token_ids=token_ids, loss_mask=loss_mask,
            rollout_logprobs=[-2.0] * len(token_ids), advantage=advantage,
            group_id=f"g{index // 4}", trajectory_id=f"t{index}"))
    return samples


def test_two_ranks_train_identical_weights_and_match_one_rank(tmp_path):
    backend = DistributedJobBackend(SPEC, str(tmp_path / "model"), num_threads=1, num_ranks=2)
    workers = list(backend._workers)
    try:
        initial = backend.checksums()
        assert initial[0] == initial[1]
        warm = backend.warm_start()
        assert warm["sft_steps"] == 3 and math.isfinite(warm["sft_loss_last"])
        metrics = [backend.train_step(_samples(8)), backend.train_step(_samples(3))]
        for step in metrics:
            assert step["is_skipped"] == 0.0
            assert all(math.isfinite(value) for value in step.values())
        assert metrics[0]["num_tokens"] == sum(sum(s.loss_mask) for s in _samples(8))
        sums = backend.checksums()
        assert sums[0] == sums[1] and sums[0] != initial[0]

        # A NaN on rank 1's shard only (index 1): every rank skips, weights stay equal.
        skipped = backend.train_step(_samples(4, nan_at=1))
        assert skipped["is_skipped"] == 1.0
        assert backend.checksums() == sums

        # Same spec on one rank: same global-token-mean loss, (nearly) the same weights.
        reference = JobBackend(SPEC, str(tmp_path / "ref"), num_threads=1)
        reference.warm_start()
        expected = [reference.train_step(_samples(8)), reference.train_step(_samples(3))]
        for got, want in zip(metrics, expected, strict=True):
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-3)
        reference.save_weights(str(tmp_path / "ref.safetensors"))
        backend.save_weights(str(tmp_path / "dp.safetensors"))
        ours, theirs = (load_file(str(tmp_path / "dp.safetensors")),
                        load_file(str(tmp_path / "ref.safetensors")))
        assert all(torch.allclose(ours[name], theirs[name], atol=1e-5) for name in ours)
        assert state_checksum(reference.model) != initial[0]
    finally:
        backend.close()
    assert all(not worker.is_alive() and worker.exitcode == 0 for worker in workers)
    assert not [child for child in multiprocessing.active_children()
                if child.name.startswith("libra-trainer-rank")]
    backend.close()  # idempotent


def test_checkpoint_round_trip_keeps_ranks_identical(tmp_path):
    spec = JobSpec(model=SPEC.model, task=SPEC.task,
                   algorithm=AlgorithmSpec(sft_steps=0, learning_rate=1e-2))
    backend = DistributedJobBackend(spec, str(tmp_path / "model"), num_threads=1, num_ranks=2)
    try:
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        backend.train_step(_samples(4))
        assert sorted(backend.save_checkpoint(str(ckpt))) == sorted(
            ["model.safetensors", "optimizer.pt", "rng.pt"])
        saved = backend.checksums()
        backend.train_step(_samples(4))
        backend.load_checkpoint(str(ckpt))
        assert backend.checksums() == saved
        (ckpt / "optimizer.pt").write_bytes(b"garbage")
        with pytest.raises(ValueError, match="optimizer.pt"):
            backend.load_checkpoint(str(ckpt))
        assert len(set(backend.checksums())) == 1  # still serving after the error
    finally:
        backend.close()
