"""The torch trainer backend over real Hugging Face architectures (tiny random Llama with
tied embeddings, Qwen2 untied, Qwen3 tied): published weights, checkpoints, gradient
checkpointing, dtypes and devices."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from libra.models.hf import load_causal_lm, load_tokenizer
from libra.training.samples import TrainSample
from libra.training.torch_backend import TorchTrainerBackend
from services.rollout.engine_types import GenerationRequest
from services.rollout.torch_engine import TorchEngine

FAMILIES = ("llama", "qwen2", "qwen3")
_TEXTS = ["What is 37+58*2? Use the calculator.", "She had 40 and gave away 13."]


def _backend(model_dir, seed: int = 0, **kwargs) -> TorchTrainerBackend:
    kwargs.setdefault("device", "cpu")
    tokenizer = load_tokenizer(str(model_dir))
    model = load_causal_lm(str(model_dir), dtype=kwargs.pop("dtype", "float32"), device="cpu")
    return TorchTrainerBackend(model, pad_token_id=tokenizer.pad_token_id, seed=seed,
                               learning_rate=1e-2, **kwargs)


def _samples(model_dir, advantages=(1.0, -1.0)) -> list[TrainSample]:
    tokenizer = load_tokenizer(str(model_dir))
    samples = []
    for index, (text, advantage) in enumerate(zip(_TEXTS, advantages, strict=True)):
        ids = tokenizer(text)["input_ids"]
        samples.append(TrainSample(
            token_ids=ids, loss_mask=[0] * 4 + [1] * (len(ids) - 4),
            rollout_logprobs=[0.0] * 4 + [-3.0] * (len(ids) - 4), advantage=advantage,
            group_id="g", trajectory_id=f"t{index}"))
    return samples


def _tied(model) -> bool:
    return model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("family", FAMILIES)
def test_published_weights_load_into_the_engine_and_logprobs_agree(
        hf_model_dir, tmp_path, family):
    model_dir = hf_model_dir(family)
    backend = _backend(model_dir)
    assert backend.train_step(_samples(model_dir))["is_skipped"] == 0.0
    path = tmp_path / "policy.safetensors"
    backend.save_weights(str(path))
    with safe_open(str(path), "pt") as published:
        names = set(published.keys())
    tied = bool(backend.model.config.tie_word_embeddings)
    expected = set(backend.model.state_dict()) - ({"lm_head.weight"} if tied else set())
    assert names == expected  # HF names, the tied copy once

    engine = TorchEngine.from_model_dir(str(model_dir), device="cpu")
    engine.load_weights(str(path), version=1)
    assert _tied(engine.model) is tied
    prompt = load_tokenizer(str(model_dir))(_TEXTS[0])["input_ids"]
    result = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=10,
                                                seed=3)])[0]
    ids = torch.tensor([prompt + result.token_ids])
    with torch.no_grad():
        trainer = backend._fwd.token_logprobs(ids, torch.ones_like(ids))[0, len(prompt):]
    drift = (trainer - torch.tensor(result.logprobs)).abs().max().item()
    assert drift < 2e-5, f"{family}: engine vs trainer log-prob drift {drift:.2e}"


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_checkpoint_restores_a_tied_model_exactly(hf_model_dir, tmp_path, family):
    model_dir = hf_model_dir(family)
    original = _backend(model_dir)
    original.train_step(_samples(model_dir))
    original.save_checkpoint(str(tmp_path))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as saved:
        assert "lm_head.weight" not in saved.keys()
    original.train_step(_samples(model_dir, (-1.0, 1.0)))

    restored = _backend(model_dir, seed=5)
    restored.load_checkpoint(str(tmp_path))
    restored.train_step(_samples(model_dir, (-1.0, 1.0)))
    assert _tied(restored.model)
    after, expected = restored.model.state_dict(), original.model.state_dict()
    assert all(torch.allclose(after[name], expected[name], atol=1e-6) for name in expected)


def test_trainer_load_weights_refuses_a_file_missing_a_key(hf_model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    backend = _backend(hf_model_dir("qwen2"))
    path = tmp_path / "w.safetensors"
    backend.save_weights(str(path))
    state = load_file(str(path))
    del state["lm_head.weight"]  # untied: the head is a weight of its own
    save_file(state, str(path))
    with pytest.raises(ValueError, match="missing keys lm_head.weight"):
        backend.load_weights(str(path))


def _count_layer_forwards(backend) -> list[int]:
    calls = [0]
    layer = backend.model.model.layers[0]
    layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_gradient_checkpointing_recomputes_layers_and_gives_the_same_step(hf_model_dir):
    model_dir = hf_model_dir("qwen3")
    plain, checkpointed = _backend(model_dir), _backend(model_dir, gradient_checkpointing=True)
    assert checkpointed.model.is_gradient_checkpointing
    plain_calls, checkpointed_calls = (_count_layer_forwards(plain),
                                       _count_layer_forwards(checkpointed))
    first = plain.train_step(_samples(model_dir))
    second = checkpointed.train_step(_samples(model_dir))
    # Proximal recompute + forward with grad, and with checkpointing a rerun in backward.
    assert (plain_calls[0], checkpointed_calls[0]) == (2, 3)
    assert second["loss"] == pytest.approx(first["loss"], abs=1e-6)
    after, expected = checkpointed.model.state_dict(), plain.model.state_dict()
    assert all(torch.allclose(after[name], expected[name], atol=1e-6) for name in expected)


def test_training_forwards_run_without_a_kv_cache(hf_model_dir):
    model_dir = hf_model_dir("llama")
    backend = _backend(model_dir)
    seen = []
    backend.model.register_forward_pre_hook(
        lambda _module, _args, kwargs: seen.append(kwargs.get("use_cache")), with_kwargs=True)
    backend.train_step(_samples(model_dir))
    assert seen == [False, False]


def test_a_bfloat16_model_trains_on_float32_master_weights_and_publishes_bfloat16(
        hf_model_dir, tmp_path):
    model_dir = hf_model_dir("llama")
    backend = _backend(model_dir, dtype="bfloat16")
    assert {p.dtype for p in backend.model.parameters()} == {torch.float32}
    assert backend.compute_dtype == torch.bfloat16 and _tied(backend.model)
    before = {name: tensor.clone() for name, tensor in backend.model.state_dict().items()}
    metrics = backend.train_step(_samples(model_dir))
    assert metrics["is_skipped"] == 0.0
    state = backend._optimizer.state[backend.model.model.embed_tokens.weight]
    assert state["exp_avg"].dtype == torch.float32
    assert any(not torch.equal(before[n], t) for n, t in backend.model.state_dict().items())
    path = tmp_path / "policy.safetensors"
    backend.save_weights(str(path))
    with safe_open(str(path), "pt") as published:
        assert {published.get_tensor(k).dtype for k in published.keys()} == {torch.bfloat16}
    engine = TorchEngine.from_model_dir(str(model_dir), device="cpu", dtype="bfloat16")
    engine.load_weights(str(path), version=1)
    embed = backend.model.model.embed_tokens.weight.detach().to(torch.bfloat16)
    assert torch.equal(engine.model.lm_head.weight, embed)


def test_the_default_device_is_cuda_when_visible_else_cpu(hf_model_dir):
    tokenizer = load_tokenizer(str(hf_model_dir("llama")))
    backend = TorchTrainerBackend(load_causal_lm(str(hf_model_dir("llama"))),
                                  pad_token_id=tokenizer.pad_token_id)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert backend.device.type == expected
    assert next(backend.model.parameters()).device.type == expected
    assert backend.compute_dtype == (torch.bfloat16 if expected == "cuda" else torch.float32)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_training_publishes_weights_a_cpu_engine_serves(hf_model_dir, tmp_path):
    model_dir = hf_model_dir("qwen3")
    backend = _backend(model_dir, device="cuda", gradient_checkpointing=True)
    assert backend.device.type == "cuda" and backend.compute_dtype == torch.bfloat16
    assert backend.train_step(_samples(model_dir))["is_skipped"] == 0.0
    path = tmp_path / "policy.safetensors"
    backend.save_weights(str(path))
    engine = TorchEngine.from_model_dir(str(model_dir), device="cpu")
    engine.load_weights(str(path), version=1)
    prompt = load_tokenizer(str(model_dir))(_TEXTS[1])["input_ids"]
    result = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=8,
                                                seed=1)])[0]
    ids = torch.tensor([prompt + result.token_ids], device="cuda")
    with torch.no_grad():
        trainer = backend._fwd.token_logprobs(ids, torch.ones_like(ids))[0, len(prompt):].cpu()
    assert (trainer - torch.tensor(result.logprobs)).abs().max().item() < 0.05


def test_micro_batches_give_the_whole_batchs_update(hf_model_dir) -> None:
    """Accumulating token-weighted micro-batch gradients equals one step on the batch."""
    from transformers import AutoModelForCausalLM

    from libra.training.samples import TrainSample
    from libra.training.torch_backend import TorchTrainerBackend
    from libra.types import GroupId, TrajectoryId

    path = hf_model_dir("qwen2")
    gen = torch.Generator().manual_seed(0)
    samples = []
    for index, length in enumerate([9, 14, 6, 11, 8]):  # uneven: token weights matter
        ids = torch.randint(5, 300, (length,), generator=gen).tolist()
        mask = [0, 0, 0] + [1] * (length - 3)
        samples.append(TrainSample(token_ids=ids, loss_mask=mask,
                                   rollout_logprobs=[-1.0] * length,
                                   advantage=float(index % 3 - 1), group_id=GroupId("g"),
                                   trajectory_id=TrajectoryId(f"t{index}")))
    results = {}
    for micro in (0, 2):
        backend = TorchTrainerBackend(AutoModelForCausalLM.from_pretrained(path),
                                      pad_token_id=0, device="cpu", micro_batch_size=micro,
                                      learning_rate=1e-2)
        metrics = backend.train_step(samples, is_cap=2.0)
        results[micro] = (metrics, {k: v.clone() for k, v in backend.model.state_dict().items()})
    (whole, whole_w), (micro, micro_w) = results[0], results[2]
    for name, tensor in whole_w.items():
        assert torch.allclose(tensor, micro_w[name], atol=1e-5), name
    for name in ("loss", "grad_norm", "num_tokens", "clip_fraction"):
        assert whole[name] == pytest.approx(micro[name], rel=1e-4, abs=1e-6), name
