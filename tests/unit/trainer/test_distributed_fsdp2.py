"""FSDP2 trainer ranks: 2 gloo ranks on CPU (this process + one spawned worker), checked
against a 1-rank run; the same on 2 GPUs (NCCL) where they exist."""

import copy
import dataclasses
import math

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

from libra.jobspec import AlgorithmSpec, JobSpec, ModelSpec, TaskSpec
from libra.training.backend import JobBackend
from libra.training.tensors import state_checksum
from libra.training.torch_backend import TorchTrainerBackend
from services.trainer.distributed import (
    DistributedJobBackend,
    process_group_backend,
    resolve_device,
    resolve_parallelism,
)
from tests.unit.trainer.test_distributed_backend import _samples

# Two decoder layers: two fully_shard units below the root.
SPEC = JobSpec(
    model=ModelSpec(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
    task=TaskSpec(num_prompts=16),
    algorithm=AlgorithmSpec(sft_steps=3, sft_batch_size=4, learning_rate=1e-2),
)


def _assert_same_weights(path_a, path_b, atol: float) -> None:
    ours, theirs = load_file(str(path_a)), load_file(str(path_b))
    assert sorted(ours) == sorted(theirs)
    worst = max(float((ours[name] - theirs[name]).abs().max()) for name in ours)
    assert worst <= atol, worst


def test_choices_resolve_by_device() -> None:
    assert resolve_parallelism("auto", "cpu") == "ddp"
    assert resolve_parallelism("auto", "cuda") == "fsdp2"
    assert resolve_parallelism("fsdp2", "cpu") == "fsdp2"
    assert process_group_backend("cpu") == "gloo"
    assert process_group_backend("cuda") == "cpu:gloo,cuda:nccl"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="parallelism"):
        resolve_parallelism("zero3", "cpu")
    with pytest.raises(ValueError, match="device"):
        resolve_device("tpu")


def test_fsdp2_two_ranks_match_one_rank_and_checkpoint_round_trips(tmp_path) -> None:
    backend = DistributedJobBackend(SPEC, str(tmp_path / "model"), num_threads=1, num_ranks=2,
                                    parallelism="fsdp2", device="cpu")
    reference = JobBackend(SPEC, str(tmp_path / "ref"), num_threads=1)
    try:
        # Sharded: rank 0 holds half of each parameter's rows (dim 0 split over 2 ranks).
        embed = backend._local.model.get_parameter("model.embed_tokens.weight")
        assert isinstance(embed, DTensor)
        assert embed.to_local().shape[0] == math.ceil(embed.shape[0] / 2)

        assert backend.warm_start()["sft_steps"] == 3
        reference.warm_start()
        batches = [_samples(8), _samples(3)]  # 3 samples: uneven shards (2 + 1)
        for batch in batches:
            got, want = backend.train_step(batch), reference.train_step(batch)
            assert got["is_skipped"] == 0.0
            assert got["loss"] == pytest.approx(want["loss"], rel=1e-4, abs=1e-6)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-3)
            assert got["num_tokens"] == want["num_tokens"]
        sums = backend.checksums()
        assert sums[0] == sums[1]
        # A NaN on rank 1's shard only (index 1): every rank skips, the weights stay.
        assert backend.train_step(_samples(4, nan_at=1))["is_skipped"] == 1.0
        assert backend.checksums() == sums
        assert backend.save_weights(str(tmp_path / "fsdp.safetensors"))
        reference.save_weights(str(tmp_path / "ref.safetensors"))
        _assert_same_weights(tmp_path / "fsdp.safetensors", tmp_path / "ref.safetensors", 1e-5)

        # Checkpoint: model + optimizer (Adam moments) + RNG round-trip on the sharded ranks.
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        assert sorted(backend.save_checkpoint(str(ckpt))) == [
            "model.safetensors", "optimizer.pt", "rng.pt"]
        backend.train_step(_samples(4))
        backend.load_checkpoint(str(ckpt))
        assert backend.checksums() == sums
        # The next step from the checkpoint equals the 1-rank run's next step only if the
        # optimizer state came back; the FSDP2 checkpoint also loads into the 1-rank run.
        reference.load_checkpoint(str(ckpt))
        backend.train_step(_samples(6))
        reference.train_step(_samples(6))
        backend.save_weights(str(tmp_path / "fsdp2.safetensors"))
        reference.save_weights(str(tmp_path / "ref2.safetensors"))
        _assert_same_weights(tmp_path / "fsdp2.safetensors", tmp_path / "ref2.safetensors", 1e-5)

        # A 1-rank checkpoint loads into the sharded ranks too.
        ref_ckpt = tmp_path / "ref_ckpt"
        ref_ckpt.mkdir()
        reference.train_step(_samples(5))
        reference.save_checkpoint(str(ref_ckpt))
        backend.load_checkpoint(str(ref_ckpt))
        assert backend.checksums() == [state_checksum(reference.model)] * 2

        (ckpt / "optimizer.pt").write_bytes(b"garbage")
        with pytest.raises(ValueError, match="optimizer.pt"):
            backend.load_checkpoint(str(ckpt))
        assert len(set(backend.checksums())) == 1  # still serving after the error
    finally:
        backend.close()


def test_single_rank_loads_a_legacy_optimizer_file(tmp_path) -> None:
    """Checkpoints written before optimizer state was keyed by name still load."""
    backend = _tiny_backend()
    backend.train_step(_samples(4))
    assert backend.save_checkpoint(str(tmp_path))
    legacy = copy.deepcopy(backend._optimizer.state_dict())  # live tensors otherwise
    torch.save(legacy, tmp_path / "optimizer.pt")
    backend.train_step(_samples(4))
    backend.load_checkpoint(str(tmp_path))
    restored = backend._optimizer.state_dict()["state"]
    assert all(torch.equal(restored[key]["exp_avg"], legacy["state"][key]["exp_avg"])
               for key in legacy["state"])


def _tiny_backend() -> TorchTrainerBackend:
    from libra.models.tiny import TinyModelConfig, build_model

    model = build_model(TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                                        intermediate_size=64), seed=0)
    return TorchTrainerBackend(model, pad_token_id=0, learning_rate=1e-2)


def test_checkpoint_before_the_first_step_changes_nothing(tmp_path) -> None:
    """Saving (or loading) an empty optimizer state must not start Adam's step count."""
    plain, saved = _tiny_backend(), _tiny_backend()
    saved.save_checkpoint(str(tmp_path))
    restored = _tiny_backend()
    restored.load_checkpoint(str(tmp_path))
    assert not saved._optimizer.state and not restored._optimizer.state
    for backend in (plain, saved, restored):
        backend.train_step(_samples(4))
        backend.train_step(_samples(4))
    assert state_checksum(plain.model) == state_checksum(saved.model)
    assert state_checksum(plain.model) == state_checksum(restored.model)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices (NCCL ranks)")
def test_cuda_ranks_default_to_fsdp2_over_nccl(tmp_path) -> None:
    backend = DistributedJobBackend(SPEC, str(tmp_path / "model"), num_threads=1, num_ranks=2)
    reference = JobBackend(SPEC, str(tmp_path / "ref"), num_threads=1)  # CPU, 1 rank
    try:
        assert (backend.device, backend.parallelism) == ("cuda", "fsdp2")
        assert next(backend._local.model.parameters()).device.type == "cuda"
        backend.warm_start()
        reference.warm_start()
        got, want = backend.train_step(_samples(8)), reference.train_step(_samples(8))
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-3, abs=1e-5)
        sums = backend.checksums()
        assert sums[0] == sums[1]
        backend.save_weights(str(tmp_path / "gpu.safetensors"))
        reference.save_weights(str(tmp_path / "cpu.safetensors"))
        _assert_same_weights(tmp_path / "gpu.safetensors", tmp_path / "cpu.safetensors", 1e-3)
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        backend.save_checkpoint(str(ckpt))
        backend.train_step(_samples(4))
        backend.load_checkpoint(str(ckpt))
        assert backend.checksums() == sums
    finally:
        backend.close()


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_ranks_load_init_from_weights_alike(tmp_path, parallelism: str) -> None:
    """``algorithm.init_from``: every rank loads a checkpoint's model weights (FSDP2 keeps
    its shard of them) and publishes exactly those weights."""
    source = JobSpec(model=dataclasses.replace(SPEC.model, seed=7), task=SPEC.task)
    other = JobBackend(source, str(tmp_path / "src"), num_threads=1)
    (tmp_path / "ckpt").mkdir()
    other.save_checkpoint(str(tmp_path / "ckpt"))
    other.save_weights(str(tmp_path / "src.safetensors"))
    backend = DistributedJobBackend(SPEC, str(tmp_path / "model"), num_threads=1, num_ranks=2,
                                    parallelism=parallelism, device="cpu")
    try:
        backend.load_model_weights(str(tmp_path / "ckpt"))
        assert len(set(backend.checksums())) == 1
        backend.save_weights(str(tmp_path / "dp.safetensors"))
        _assert_same_weights(tmp_path / "dp.safetensors", tmp_path / "src.safetensors", 0.0)
    finally:
        backend.close()
