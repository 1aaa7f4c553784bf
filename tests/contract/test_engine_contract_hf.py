"""The engine contract on a Hugging Face chat model (tiny random Qwen3 with tied
embeddings, head_dim 32): both engines load the directory the trainer writes, stop on a
stop string, and serve the trainer's published weights (tied tensors stored once) with
the log-probs of a transformers forward. The torch engine always (``make test``), vLLM
where it imports (``make test-vllm``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from libra import types as t
from libra.jobspec import ModelSpec
from libra.training.torch_backend import TorchTrainerBackend
from services.rollout.backend import TorchEngineLoader
from services.rollout.engine_types import GenerationRequest
from services.rollout.vllm_engine import VllmEngineLoader, VllmEngineOptions, vllm_available
from tests.fixtures.hf_models import make_model_dir

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
_TOLERANCE = {"torch": 1e-5, "vllm": 2e-3}
MODEL = ModelSpec(kind="hf", path="/unused", dtype="float32")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir("qwen3", tmp_path_factory.mktemp("hf-qwen3") / "model",
                          hidden_size=128)


@pytest.fixture(scope="module")
def published(model_dir: Path) -> tuple[Path, AutoModelForCausalLM]:
    """A policy version as the trainer publishes it, and a model holding those weights."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    path = model_dir.parent / "v000001.safetensors"
    TorchTrainerBackend(model, pad_token_id=0, device="cpu").save_weights(str(path))
    return path, model.eval()


@pytest.fixture(scope="module", params=["torch", "vllm"])
def engine(request: pytest.FixtureRequest, model_dir: Path) -> Iterator:
    policy = t.PolicyInfo(version=0, weights_path="", sha256="", model_dir=str(model_dir))
    if request.param == "torch":
        loaded, tokenizer = TorchEngineLoader(num_threads=1, device="cpu").load(
            str(model_dir), policy, 1, MODEL)
        loaded.kind, loaded.tokenizer = "torch", tokenizer
        yield loaded
        return
    if not vllm_available():
        pytest.skip("vllm is not installed here (make test-vllm runs these in .venv-vllm)")
    loader = VllmEngineLoader(VllmEngineOptions(max_num_seqs=8, seed=0))
    loaded, tokenizer = loader.load(str(model_dir), policy, 1, MODEL)
    loaded.kind, loaded.tokenizer = "vllm", tokenizer
    yield loaded
    loader.shutdown()


def _prompt(engine) -> list[int]:
    return engine.tokenizer.encode("<|im_start|>user\nWhat is 12*7?<|im_end|>\n"
                                   "<|im_start|>assistant\n")


def test_generates_token_in_token_out_on_an_hf_directory(engine) -> None:
    (result,) = engine.generate([GenerationRequest(prompt_token_ids=_prompt(engine),
                                                   max_new_tokens=12, temperature=0.0)])
    assert len(result.token_ids) == len(result.logprobs) <= 12
    assert all(lp <= 0 for lp in result.logprobs)


def test_a_stop_string_ends_the_turn_with_the_tokens_that_completed_it(engine) -> None:
    prompt = _prompt(engine)
    (free,) = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=16,
                                                 seed=5)])
    pieces = [engine.tokenizer.decode([tok]) for tok in free.token_ids]
    # The same seed samples the same text again: stop on its third visible token's text.
    visible = [piece for piece in pieces if piece.strip()]
    assert len(visible) >= 3, pieces
    stop = visible[2].strip()
    (cut,) = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=16,
                                                seed=5, stop_strings=[stop])])
    assert cut.finish_reason == "stop"
    assert cut.token_ids == free.token_ids[:len(cut.token_ids)]
    assert stop in engine.tokenizer.decode(cut.token_ids)
    assert stop not in engine.tokenizer.decode(cut.token_ids[:-1])


def test_the_trainers_published_weights_serve_with_a_forward_passs_logprobs(
        engine, published) -> None:
    path, model = published
    engine.load_weights(str(path), 1)
    prompt = _prompt(engine)
    (result,) = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=8,
                                                   seed=3)])
    assert result.policy_version == 1
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + result.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    expected = [logp[len(prompt) - 1 + i, tok].item() for i, tok in enumerate(result.token_ids)]
    assert max(abs(a - b) for a, b in zip(result.logprobs, expected, strict=True)) < (
        _TOLERANCE[engine.kind])
