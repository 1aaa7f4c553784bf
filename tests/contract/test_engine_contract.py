"""One contract for every rollout engine: the torch engine always (``make test``), the vLLM
engine where ``vllm`` imports (``make test-vllm`` runs this file in ``.venv-vllm``).

Each engine is built by its loader from the same tiny demo model dir (HF ``save_pretrained``
output), so the vLLM case loads exactly what the rollout service loads in production.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from libra import types as t
from libra.models import TinyModelConfig, build_model, build_tokenizer, save_model_dir
from libra.models.tiny import load_model_dir
from services.rollout.backend import TorchEngineLoader
from services.rollout.engine_types import GenerationRequest
from services.rollout.vllm_engine import (
    VllmEngine,
    VllmEngineLoader,
    VllmEngineOptions,
    VllmModelLoadError,
    VllmNotInstalledError,
    import_vllm,
    vllm_available,
)

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# The demo's shape (head_dim 32, which vLLM's CPU attention supports), fewer layers' width.
_CFG = TinyModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256)
# Log-prob agreement with a transformers forward pass of the same fp32 weights.
_TOLERANCE = {"torch": 1e-5, "vllm": 2e-3}
HAVE_VLLM = vllm_available()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-model")
    save_model_dir(build_model(_CFG, seed=0), build_tokenizer(), str(path))
    return path


@pytest.fixture(scope="module")
def other_weights(model_dir: Path) -> Path:
    """A published policy version: different weights of the same shapes."""
    path = model_dir.parent / "policy-v1.safetensors"
    state = {k: v.contiguous() for k, v in build_model(_CFG, seed=1).state_dict().items()}
    save_file(state, str(path))
    return path


@pytest.fixture(scope="module", params=["torch", "vllm"])
def engine(request: pytest.FixtureRequest, model_dir: Path) -> Iterator:
    policy = t.PolicyInfo(version=0, weights_path=str(model_dir / "model.safetensors"),
                          sha256="", model_dir=str(model_dir))
    if request.param == "torch":
        loaded, _tokenizer = TorchEngineLoader(num_threads=1, seed=0).load(str(model_dir), policy)
        loaded.kind = "torch"
        loaded.load_weights(policy.weights_path, 0)
        yield loaded
        return
    if not HAVE_VLLM:
        pytest.skip("vllm is not installed here (make test-vllm runs these in .venv-vllm)")
    loader = VllmEngineLoader(VllmEngineOptions(max_num_seqs=8, seed=0))
    loaded, _tokenizer = loader.load(str(model_dir), policy)
    loaded.kind = "vllm"
    loaded.load_weights(policy.weights_path, 0)
    print(f"\n[bench] vllm engine start {loaded.start_s:.1f}s", file=sys.stderr)
    yield loaded
    loader.shutdown()


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    model, _tokenizer = load_model_dir(str(model_dir))
    return model


def _prompt(text: str) -> list[int]:
    return build_tokenizer()(text)["input_ids"]


def _request(text: str = "Q:12+7=", **overrides) -> GenerationRequest:
    fields = dict(prompt_token_ids=_prompt(text), max_new_tokens=8, seed=11)
    fields.update(overrides)
    return GenerationRequest(**fields)


def _reference_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    start = len(prompt) - 1
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[start + i, token].item() for i, token in enumerate(tokens)]


def _greedy(engine, text: str = "Q:12+7=", n: int = 8):
    return engine.generate([_request(text, temperature=0.0, max_new_tokens=n)])[0]


# -- shape and finish reasons -------------------------------------------------------------
def test_token_in_token_out_one_result_per_request_in_order(engine) -> None:
    prompts = ["Q:1+2=", "Q:12*34-5=<calc>", "Q:7="]
    results = engine.generate([_request(p, max_new_tokens=6, seed=i)
                               for i, p in enumerate(prompts)])
    assert len(results) == len(prompts)
    vocab = build_tokenizer()
    for result in results:
        assert len(result.token_ids) == 6 and result.finish_reason == "length"
        assert len(result.logprobs) == len(result.token_ids)
        assert all(isinstance(x, int) and 0 <= x < len(vocab) for x in result.token_ids)
        assert all(lp <= 1e-6 for lp in result.logprobs)
        assert result.policy_version == engine.policy_version == 0
    assert engine.generate([]) == []


def test_stop_token_ends_the_turn_and_is_kept(engine) -> None:
    free = _greedy(engine, n=8)
    stop = free.token_ids[2]
    cut = free.token_ids.index(stop)
    result = engine.generate([_request(temperature=0.0, max_new_tokens=8,
                                       stop_token_ids=[stop])])[0]
    assert result.token_ids == free.token_ids[:cut + 1]
    assert result.token_ids[-1] == stop and result.finish_reason == "stop"
    assert len(result.logprobs) == len(result.token_ids)


def test_max_new_tokens_is_respected_with_finish_reason_length(engine) -> None:
    for n in (1, 5):
        result = engine.generate([_request(max_new_tokens=n, stop_token_ids=[])])[0]
        assert len(result.token_ids) == n and result.finish_reason == "length"
    empty = engine.generate([_request(max_new_tokens=0)])[0]
    assert empty.token_ids == [] and empty.logprobs == [] and empty.finish_reason == "length"


def test_equal_seeds_give_equal_samples(engine) -> None:
    first = engine.generate([_request(max_new_tokens=16, seed=5)])[0]
    again = engine.generate([_request(max_new_tokens=16, seed=5)])[0]
    other = engine.generate([_request(max_new_tokens=16, seed=6)])[0]
    assert first.token_ids == again.token_ids
    assert first.logprobs == pytest.approx(again.logprobs, abs=1e-6)
    assert other.token_ids != first.token_ids


# -- log-probs are the temperature-1 policy's --------------------------------------------
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (1.7, 0.9), (0.0, 1.0)])
def test_logprobs_equal_a_full_forward_pass(engine, reference, temperature, top_p) -> None:
    request = _request("Q:33-4*7=", max_new_tokens=12, temperature=temperature, top_p=top_p)
    result = engine.generate([request])[0]
    expected = _reference_logprobs(reference, request.prompt_token_ids, result.token_ids)
    assert result.logprobs == pytest.approx(expected, abs=_TOLERANCE[engine.kind])


# -- abort ----------------------------------------------------------------------------------
def _stopped_part_way(engine, requests: list[GenerationRequest], stop, full_s: float) -> list:
    """``engine.generate(requests)`` with ``stop()`` called part-way through row 0's turn.

    The engines offer no "n tokens done" signal to stop on, and a delay measured on one
    call misses on the next when the machine's load changes in between (the turn ends
    first, or no token is out yet). So a miss is run again with the delay halved (the
    turn ended) or doubled (no token yet): a working abort lands within a few tries
    whatever the load; a broken one never does."""
    delay_s = max(0.3 * full_s, 0.005)
    for _ in range(12):
        timer = threading.Timer(delay_s, stop)
        timer.start()
        results = engine.generate(requests)
        timer.join()  # fired: a late stop fell between calls, which the next call clears
        first = results[0]
        if first.finish_reason == "aborted" and first.token_ids:
            return results
        delay_s = delay_s / 2 if first.finish_reason == "length" else delay_s * 2
    raise AssertionError(f"no stop landed part-way in 12 tries (last: {first.finish_reason}, "
                         f"{len(first.token_ids)} tokens, delay {delay_s:.4f} s)")


def test_abort_keeps_the_tokens_so_far_as_a_prefix(engine) -> None:
    request = _request("Q:5=", max_new_tokens=200, seed=3)
    engine.generate([request])  # warm (a first call of this shape may compile)
    started = time.perf_counter()
    full = engine.generate([request])[0]
    full_s = time.perf_counter() - started
    assert full.finish_reason == "length" and len(full.token_ids) == 200

    (result,) = _stopped_part_way(engine, [request], engine.abort, full_s)
    assert result.finish_reason == "aborted"
    assert 0 < len(result.token_ids) < 200
    assert len(result.logprobs) == len(result.token_ids)
    # Same seed: the aborted turn is exactly a prefix of the uninterrupted one.
    assert result.token_ids == full.token_ids[:len(result.token_ids)]
    assert result.logprobs == pytest.approx(full.logprobs[:len(result.logprobs)],
                                            abs=_TOLERANCE[engine.kind])


def test_abort_rows_stops_only_those_requests(engine) -> None:
    requests = [_request("Q:5=", max_new_tokens=200, seed=3),
                _request("Q:12+7=", max_new_tokens=200, seed=5)]
    started = time.perf_counter()
    full = engine.generate(requests[:1])[0]
    full_s = time.perf_counter() - started

    stopped, carried_on = _stopped_part_way(engine, requests,
                                            lambda: engine.abort_rows([0]), full_s)
    assert stopped.finish_reason == "aborted" and 0 < len(stopped.token_ids) < 200
    assert stopped.token_ids == full.token_ids[:len(stopped.token_ids)]
    assert carried_on.finish_reason == "length" and len(carried_on.token_ids) == 200
    # A row stop is for the call in flight only.
    assert engine.generate(requests[:1])[0].finish_reason == "length"


def test_an_abort_between_calls_does_not_affect_the_next_call(engine) -> None:
    engine.abort()
    result = engine.generate([_request(max_new_tokens=4)])[0]
    assert result.finish_reason == "length" and len(result.token_ids) == 4


# -- weights --------------------------------------------------------------------------------
def test_load_weights_changes_outputs_and_policy_version(engine, model_dir, other_weights,
                                                         reference) -> None:
    before = _greedy(engine, n=8)
    started = time.perf_counter()
    engine.load_weights(str(other_weights), 1)
    reload_s = time.perf_counter() - started
    print(f"\n[bench] {engine.kind} weight reload {reload_s * 1000:.1f} ms", file=sys.stderr)
    try:
        assert engine.policy_version == 1
        after = _greedy(engine, n=8)
        assert after.policy_version == 1
        assert (after.token_ids, after.logprobs) != (before.token_ids, before.logprobs)
        # Every token comes from the new weights (no stale prefix-cache KV).
        new_model = build_model(_CFG, seed=1)
        expected = _reference_logprobs(new_model, _prompt("Q:12+7="), after.token_ids)
        assert after.logprobs == pytest.approx(expected, abs=_TOLERANCE[engine.kind])
    finally:
        engine.load_weights(str(model_dir / "model.safetensors"), 2)
    restored = _greedy(engine, n=8)
    assert restored.token_ids == before.token_ids and restored.policy_version == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_a_bad_weights_file_is_refused_and_the_old_weights_keep_serving(
        engine, model_dir, tmp_path, damage) -> None:
    version, before = engine.policy_version, _greedy(engine, n=6)
    bad = tmp_path / "bad.safetensors"
    if damage == "garbage":
        bad.write_bytes(b"\x00\x01not a safetensors file" * 10)
    elif damage == "truncated":
        data = (model_dir / "model.safetensors").read_bytes()
        bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception):  # noqa: B017 - each engine raises its own error type
        engine.load_weights(str(bad), version + 1)
    assert engine.policy_version == version
    after = _greedy(engine, n=6)
    assert after.token_ids == before.token_ids and after.policy_version == version


# -- vLLM-specific bad input (run everywhere; what they need is checked inside) ------------
def test_missing_vllm_names_the_extra_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(VllmNotInstalledError, match="requirements-vllm.txt"):
        import_vllm()
    from services.rollout.__main__ import engine_loader
    from services.rollout.config import RolloutConfig

    with pytest.raises(VllmNotInstalledError, match="make test-vllm"):
        engine_loader(RolloutConfig(engine="vllm"))
    with pytest.raises(ValueError, match="torch or vllm"):
        engine_loader(RolloutConfig(engine="tensorrt"))
    assert isinstance(engine_loader(RolloutConfig()), TorchEngineLoader)


@pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed here")
def test_vllm_refuses_a_model_dir_it_cannot_load(tmp_path) -> None:
    with pytest.raises(VllmModelLoadError, match="no config.json"):
        VllmEngine.start(str(tmp_path / "nowhere"))
    empty = tmp_path / "empty-weights"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    (empty / "model.safetensors").write_bytes(b"")
    with pytest.raises(VllmModelLoadError, match="unreadable"):
        VllmEngine.start(str(empty))
    broken = tmp_path / "broken"
    save_model_dir(build_model(_CFG, seed=0), build_tokenizer(), str(broken))
    (broken / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(VllmModelLoadError, match="cannot load model dir"):
        VllmEngine.start(str(broken))
