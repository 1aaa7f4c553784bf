"""The trainer's JobBackend on a Hugging Face model (tiny random Qwen2/Llama fixtures):
it writes an HF model directory the rollout loads, warm-starts on chat-format
demonstrations built by the rollout's own protocol, trains, and publishes weights a
TorchEngine reloads with the trainer's log-probs (the drift the trainer reports)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from libra.chat.job import chat_format
from libra.jobspec import AlgorithmSpec, JobSpec, ModelSpec, TaskSpec, ToolSchema, ToolsSpec
from libra.models.hf import load_tokenizer
from libra.tasks import chat_demonstration, load_problems
from libra.training.backend import JobBackend, _demonstrations
from libra.training.samples import TrainSample
from libra.types import GroupId, TrajectoryId
from services.rollout.backend import TorchEngineLoader
from services.rollout.engine_types import GenerationRequest

CALC = ToolSchema(name="calculator", description="Evaluate arithmetic.",
                  parameters_json=json.dumps({"type": "object", "properties": {
                      "expression": {"type": "string"}}}))


def hf_spec(path: Path) -> JobSpec:
    return JobSpec(
        model=ModelSpec(kind="hf", path=str(path), max_context_tokens=2048),
        task=TaskSpec(name="calc-words", num_prompts=16, tool_call_format="hermes"),
        tools=ToolsSpec(schemas=[CALC]),
        algorithm=AlgorithmSpec(sft_steps=2, sft_batch_size=2, sft_learning_rate=1e-3,
                                learning_rate=1e-3, prompts_per_step=2))


@pytest.fixture(params=["qwen2", "llama"])
def spec(request, hf_model_dir) -> JobSpec:
    return hf_spec(hf_model_dir(request.param))


def test_it_writes_an_hf_model_dir_with_the_tokenizer_and_chat_template(
        spec: JobSpec, tmp_path: Path) -> None:
    JobBackend(spec, str(tmp_path / "model"), num_threads=1, device="cpu")
    written = tmp_path / "model"
    assert (written / "config.json").exists() and list(written.glob("*.safetensors"))
    source = json.loads((Path(spec.model.path) / "tokenizer_config.json").read_text())
    copy = json.loads((written / "tokenizer_config.json").read_text())
    assert copy.get("chat_template") == source.get("chat_template")


def test_demonstrations_are_the_rollouts_rendering_with_only_assistant_turns_trained(
        spec: JobSpec) -> None:
    backend_tok = load_tokenizer(spec.model.path)
    problems = load_problems("calc-words", 0, 16)
    examples = _demonstrations(spec, backend_tok, problems, 4)
    chat = chat_format(spec, backend_tok)
    expected = chat.demonstration(chat_demonstration(problems[0], random.Random(0),
                                                     failure_rate=0.25, max_turns=6))
    assert (examples[0].token_ids, examples[0].loss_mask) == expected
    trained = backend_tok.decode([i for i, m in zip(*expected, strict=True) if m])
    assert "<tool_call>" in trained or "The answer is" in trained
    assert "Use the calculator" not in trained  # the prompt is not trained


def test_warm_start_train_step_and_publish_reload_into_the_engine(
        spec: JobSpec, tmp_path: Path) -> None:
    backend = JobBackend(spec, str(tmp_path / "model"), num_threads=1, device="cpu")
    stats = backend.warm_start()
    assert stats["sft_steps"] == 2 and stats["sft_loss_last"] > 0
    engine, tok = TorchEngineLoader(device="cpu").load(str(tmp_path / "model"), None, 1,
                                                       spec.model)
    chat = chat_format(spec, tok.tokenizer)
    prompt = chat.prompt_ids([{"role": "user", "content": "What is 12*7?"}])
    (result,) = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=6,
                                                   seed=1)])
    ids = prompt + result.token_ids
    sample = TrainSample(token_ids=ids, loss_mask=[0] * len(prompt) + [1] * len(result.token_ids),
                         rollout_logprobs=[0.0] * len(prompt) + result.logprobs,
                         advantage=1.0, group_id=GroupId("g"), trajectory_id=TrajectoryId("t"))
    metrics = backend.train_step([sample, sample])
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    path = tmp_path / "v1.safetensors"
    backend.save_weights(str(path))
    engine.load_weights(str(path), 1)
    (again,) = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=6,
                                                  seed=1)])
    assert again.policy_version == 1
