"""Unit tests for the torch trainer backend: SFT, PPO steps, skips and weight files."""

import math
import random

import pytest
import torch

from libra.models import TinyModelConfig, build_model, build_tokenizer, encode_segments
from libra.tasks.arith import ArithDataset, demonstration
from libra.training.samples import SftExample, TrainSample
from libra.training.torch_backend import TorchTrainerBackend
from services.rollout.engine_types import GenerationRequest
from services.rollout.torch_engine import TorchEngine

_CFG = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def _backend(seed=0):
    # On the CPU everywhere: these tests compare with CPU engines and CPU tensors.
    return TorchTrainerBackend(
        build_model(_CFG, seed=seed), pad_token_id=0, seed=seed, learning_rate=1e-2,
        device="cpu",
    )


def _samples(advantages):
    samples = []
    for index, advantage in enumerate(advantages):
        length = 6 + index
        samples.append(
            TrainSample(
                token_ids=[1] + [10 + (index + t) % 9 for t in range(length - 1)],
                loss_mask=[0, 0] + [1] * (length - 2),
                rollout_logprobs=[0.0, 0.0] + [-2.0] * (length - 2),
                advantage=advantage,
                group_id="g",
                trajectory_id=f"t{index}",
            )
        )
    return samples


def _weights(backend):
    return {name: tensor.clone() for name, tensor in backend.model.state_dict().items()}


def test_train_step_changes_weights_and_reports_metrics():
    backend = _backend()
    before = _weights(backend)
    metrics = backend.train_step(_samples([1.0, -1.0]))
    assert metrics["is_skipped"] == 0.0 and metrics["num_tokens"] == 9.0
    assert metrics["clip_fraction"] == 0.0 and metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["logprob_drift"] > 0.0
    after = backend.model.state_dict()
    assert any(not torch.equal(before[name], after[name]) for name in before)


def test_non_finite_loss_skips_the_step():
    backend = _backend()
    before = _weights(backend)
    metrics = backend.train_step(_samples([math.nan, 1.0]))
    assert metrics["is_skipped"] == 1.0
    after = backend.model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_steps_are_deterministic_for_a_seed():
    first, second = _backend(seed=3), _backend(seed=3)
    assert (
        first.train_step(_samples([1.0, -1.0]))["loss"]
        == second.train_step(_samples([1.0, -1.0]))["loss"]
    )


def test_sft_reduces_loss_on_demonstrations():
    tokenizer = build_tokenizer()
    rng = random.Random(0)
    examples = []
    for problem in ArithDataset(0, 32, max_ops=1):
        token_ids, loss_mask = encode_segments(tokenizer, demonstration(problem, rng))
        examples.append(SftExample(token_ids=token_ids, loss_mask=loss_mask))
    losses = _backend().sft(examples, num_steps=30, batch_size=8, lr=1e-2)
    assert len(losses) == 30 and sum(losses[-5:]) < sum(losses[:5])


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    backend = _backend()
    backend.train_step(_samples([1.0, -1.0]))
    path = str(tmp_path / "w.safetensors")
    digest = backend.save_weights(path)
    assert len(digest) == 64 and digest == backend.save_weights(str(tmp_path / "again.safetensors"))
    engine = TorchEngine(build_model(_CFG, seed=9), pad_token_id=0)
    engine.load_weights(path, version=1)
    ids = torch.tensor([[1, 12, 13, 14, 15]])
    with torch.no_grad():
        assert torch.equal(engine._model(input_ids=ids).logits, backend.model(input_ids=ids).logits)
    request = GenerationRequest(prompt_token_ids=[1, 12, 13], max_new_tokens=5, seed=4)
    reference = TorchEngine(backend.model, pad_token_id=0).generate([request])[0]
    assert engine.generate([request])[0].token_ids == reference.token_ids


def test_checkpoint_restores_model_optimizer_and_rng_exactly(tmp_path):
    original = _backend(seed=0)
    original.train_step(_samples([1.0, -1.0]))
    original.save_checkpoint(str(tmp_path))
    original.train_step(_samples([-1.0, 1.0]))
    noise = torch.rand(3)
    restored = _backend(seed=7)  # other initial weights, fresh optimizer and RNG
    restored.load_checkpoint(str(tmp_path))
    restored.train_step(_samples([-1.0, 1.0]))
    # The second step depends on AdamW's moments: equal weights mean the optimizer
    # state came back too, and the torch RNG continues where it was saved.
    after, expected = restored.model.state_dict(), original.model.state_dict()
    assert all(torch.allclose(after[name], expected[name], atol=1e-6) for name in expected)
    assert torch.equal(torch.rand(3), noise)


def test_corrupt_checkpoint_file_is_an_error_naming_it(tmp_path):
    backend = _backend()
    backend.save_checkpoint(str(tmp_path))
    (tmp_path / "optimizer.pt").write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"optimizer\.pt"):
        _backend().load_checkpoint(str(tmp_path))


def test_decoupled_step_reports_importance_weights_and_timings():
    metrics = _backend().train_step(_samples([1.0, -1.0]), is_cap=2.0)
    # Behaviour log-probs (-2.0) are far from the tiny model's: some weights truncate.
    assert 0.0 < metrics["is_weight_mean"] <= 2.0
    assert metrics["recompute_s"] > 0.0 and metrics["fwd_bwd_s"] > 0.0


def test_non_finite_weights_are_never_published(tmp_path):
    backend = _backend()
    with torch.no_grad():
        next(backend.model.parameters()).fill_(math.nan)
    with pytest.raises(ValueError, match="non-finite"):
        backend.save_weights(str(tmp_path / "w.safetensors"))
    assert not (tmp_path / "w.safetensors").exists()
