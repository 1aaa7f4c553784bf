"""The torch engine over real Hugging Face architectures (tiny random Llama with tied
embeddings, Qwen2 untied, Qwen3 tied): loading, batched sampling, stop strings and
reloading published weights."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save, save_file

from libra.models.hf import load_causal_lm, load_tokenizer
from services.rollout.engine_types import GenerationRequest
from services.rollout.torch_engine import TorchEngine

FAMILIES = ("llama", "qwen2", "qwen3")
_PROMPT = [{"role": "user", "content": "What is 12*7? Use the calculator."}]


def _prompt_ids(tokenizer) -> list[int]:
    encoded = tokenizer.apply_chat_template(_PROMPT, add_generation_prompt=True)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def _engine(model_dir, **kwargs) -> TorchEngine:
    tokenizer = load_tokenizer(str(model_dir))
    return TorchEngine.from_model_dir(str(model_dir), device="cpu", decode=tokenizer.decode,
                                      **kwargs)


def _reference_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt) - 1
    return [logprobs[start + i, token].item() for i, token in enumerate(tokens)]


@pytest.mark.parametrize("family", FAMILIES)
def test_from_model_dir_runs_on_cpu_in_float32_with_the_policy_logprobs(hf_model_dir, family):
    engine = _engine(hf_model_dir(family))
    assert engine.device == torch.device("cpu")
    assert engine.model.dtype == torch.float32
    prompt = _prompt_ids(load_tokenizer(str(hf_model_dir(family))))
    result = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=12,
                                                temperature=1.3, top_p=0.9, seed=2)])[0]
    assert len(result.token_ids) == 12
    expected = _reference_logprobs(engine.model, prompt, result.token_ids)
    assert result.logprobs == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_sampling_mode_in_one_batch_matches_each_row_alone(hf_model_dir, family):
    engine = _engine(hf_model_dir(family))
    prompt = _prompt_ids(load_tokenizer(str(hf_model_dir(family))))
    requests = [
        GenerationRequest(prompt_token_ids=prompt, max_new_tokens=10, temperature=0.0),
        GenerationRequest(prompt_token_ids=prompt[3:], max_new_tokens=10, seed=4),
        GenerationRequest(prompt_token_ids=prompt[1:], max_new_tokens=10, temperature=0.7,
                          seed=5),
        GenerationRequest(prompt_token_ids=prompt, max_new_tokens=7, temperature=1.5,
                          top_p=0.8, seed=6),
    ]
    batched = engine.generate(requests)
    for request, together in zip(requests, batched, strict=True):
        alone = engine.generate([request])[0]
        assert together.token_ids == alone.token_ids
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_a_group_sharing_a_prompt_is_prefilled_once_and_samples_as_if_alone(hf_model_dir):
    engine = _engine(hf_model_dir("qwen3"))
    prompt = _prompt_ids(load_tokenizer(str(hf_model_dir("qwen3"))))
    requests = [GenerationRequest(prompt_token_ids=prompt, max_new_tokens=9, seed=seed)
                for seed in (1, 2, 3)]
    requests.insert(2, GenerationRequest(prompt_token_ids=prompt[2:], max_new_tokens=9,
                                         seed=4))
    prefill_rows = []
    forward = engine._forward

    def recording_forward(input_ids, *args):
        prefill_rows.append(input_ids.shape[0])
        return forward(input_ids, *args)

    engine._forward = recording_forward
    batched = engine.generate(requests)
    assert prefill_rows[0] == 2 and set(prefill_rows[1:]) == {4}
    engine._forward = forward
    assert len({tuple(result.token_ids) for result in batched}) == 4  # seeds differ
    for request, together in zip(requests, batched, strict=True):
        alone = engine.generate([request])[0]
        assert together.token_ids == alone.token_ids
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_bfloat16_model_still_reports_float32_softmax_logprobs(hf_model_dir):
    engine = _engine(hf_model_dir("llama"), dtype="bfloat16")
    assert engine.model.dtype == torch.bfloat16
    prompt = _prompt_ids(load_tokenizer(str(hf_model_dir("llama"))))
    result = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=8,
                                                seed=1)])[0]
    # A full forward of the same bf16 weights; KV-cached bf16 decoding rounds differently.
    expected = _reference_logprobs(engine.model, prompt, result.token_ids)
    assert result.logprobs == pytest.approx(expected, abs=0.05)
    assert all(isinstance(value, float) for value in result.logprobs)


# -- stop strings ----------------------------------------------------------------------------
def _stop_string_from(text: str) -> str:
    """Three characters of ``text`` past its first half, none an undecodable byte."""
    for end in range(len(text) // 2, len(text) + 1):
        candidate = text[max(0, end - 3):end]
        if len(candidate) == 3 and "\ufffd" not in candidate:
            return candidate
    raise AssertionError(f"no plain 3-character stretch in {text!r}")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_stop_string_keeps_tokens_up_to_the_one_that_completes_it(hf_model_dir, family):
    tokenizer = load_tokenizer(str(hf_model_dir(family)))
    engine = _engine(hf_model_dir(family))
    prompt = _prompt_ids(tokenizer)
    free = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=24,
                                              seed=0)])[0]
    stop = _stop_string_from(tokenizer.decode(free.token_ids))
    # The definition: the first prefix of the new tokens whose text contains the string.
    cut = next(n for n in range(1, 25) if stop in tokenizer.decode(free.token_ids[:n]))
    requests = [GenerationRequest(prompt_token_ids=prompt, max_new_tokens=24, seed=0,
                                  stop_strings=["never appears \u2603", stop]),
                GenerationRequest(prompt_token_ids=prompt, max_new_tokens=24, seed=0)]
    stopped, untouched = engine.generate(requests)
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:cut]
    assert stopped.logprobs == pytest.approx(free.logprobs[:cut], abs=1e-5)
    assert untouched.token_ids == free.token_ids and untouched.finish_reason == "length"


def test_stop_strings_need_a_decode_function(hf_model_dir):
    engine = TorchEngine(load_causal_lm(str(hf_model_dir("llama"))), pad_token_id=0)
    request = GenerationRequest(prompt_token_ids=[5, 6], max_new_tokens=4,
                                stop_strings=["x"])
    with pytest.raises(ValueError, match="decode"):
        engine.generate([request])
    with pytest.raises(ValueError, match="empty"):
        GenerationRequest(prompt_token_ids=[5], max_new_tokens=4, stop_strings=[""])


# -- weight reload: the trainer's published format ----------------------------------------------
def _published(family: str, tmp_path, seed: int = 1):
    """A second policy of the family, saved as published (tied tensors once), and its model."""
    from tests.fixtures.hf_models import make_model_dir

    other = make_model_dir(family, tmp_path / "other", seed=seed)
    return other / "model.safetensors", load_causal_lm(str(other))


@pytest.mark.parametrize("family", FAMILIES)
def test_published_weights_load_with_the_tied_copy_left_out(hf_model_dir, tmp_path, family):
    engine = _engine(hf_model_dir(family))
    prompt = _prompt_ids(load_tokenizer(str(hf_model_dir(family))))
    path, source = _published(family, tmp_path)
    tied = bool(source.config.tie_word_embeddings)
    assert ("lm_head.weight" in load_file(str(path))) is not tied
    engine.load_weights(str(path), version=3)
    result = engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=8,
                                                temperature=0.0)])[0]
    assert engine.policy_version == 3 and result.policy_version == 3
    assert result.logprobs == pytest.approx(
        _reference_logprobs(source, prompt, result.token_ids), abs=1e-5)
    head, embed = engine.model.lm_head.weight, engine.model.model.embed_tokens.weight
    assert (head.data_ptr() == embed.data_ptr()) is tied


def _greedy(engine, prompt):
    return engine.generate([GenerationRequest(prompt_token_ids=prompt, max_new_tokens=6,
                                              temperature=0.0)])[0].token_ids


@pytest.mark.parametrize("family,drop,message", [
    ("llama", "model.norm.weight", "missing keys model.norm.weight"),
    ("qwen3", "model.layers.1.self_attn.q_norm.weight", "missing keys model.layers.1"),
    ("qwen2", "lm_head.weight", "missing keys lm_head.weight"),  # untied: required
])
def test_a_missing_key_is_refused_by_name_and_the_old_weights_keep_serving(
        hf_model_dir, tmp_path, family, drop, message):
    engine = _engine(hf_model_dir(family))
    prompt = _prompt_ids(load_tokenizer(str(hf_model_dir(family))))
    before = _greedy(engine, prompt)
    path, _source = _published(family, tmp_path)
    state = load_file(str(path))
    del state[drop]
    with pytest.raises(ValueError, match=message):
        engine.load_weights_bytes(save(state), version=1)
    assert engine.policy_version == 0 and _greedy(engine, prompt) == before


def test_an_unexpected_key_or_a_wrong_shape_is_refused_by_name(hf_model_dir, tmp_path):
    engine = _engine(hf_model_dir("llama"))
    path, _source = _published("llama", tmp_path)
    state = load_file(str(path))
    with pytest.raises(ValueError, match="unexpected keys model.extra.weight"):
        engine.load_weights_bytes(save({**state, "model.extra.weight": torch.zeros(2)}), 1)
    bad = {**state, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"model\.norm\.weight \(3,\)"):
        engine.load_weights_bytes(save(bad), 1)


def test_a_tied_copy_may_be_present_but_must_equal_its_source(hf_model_dir, tmp_path):
    engine = _engine(hf_model_dir("qwen3"))
    path, source = _published("qwen3", tmp_path)
    state = load_file(str(path))
    both = tmp_path / "both.safetensors"
    save_file({**state, "lm_head.weight": state["model.embed_tokens.weight"].clone()}, str(both))
    engine.load_weights(str(both), version=1)
    assert torch.equal(engine.model.lm_head.weight, source.lm_head.weight)
    differing = {**state, "lm_head.weight": state["model.embed_tokens.weight"] + 1.0}
    with pytest.raises(ValueError, match="tied weights differ: lm_head.weight"):
        engine.load_weights_bytes(save(differing), version=2)


def test_the_model_dir_itself_reloads_as_a_policy_version(hf_model_dir, tmp_path):
    """save_pretrained output is the published format too (tied copy left out)."""
    model_dir = tmp_path / "copy"
    shutil.copytree(hf_model_dir("llama"), model_dir)
    engine = _engine(model_dir)
    engine.load_weights(str(model_dir / "model.safetensors"), version=5)
    assert engine.policy_version == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_matches_the_cpu_engine(hf_model_dir):
    tokenizer = load_tokenizer(str(hf_model_dir("qwen3")))
    prompt = _prompt_ids(tokenizer)
    cpu = _engine(hf_model_dir("qwen3"))
    cuda = TorchEngine.from_model_dir(str(hf_model_dir("qwen3")), device="cuda",
                                      dtype="float32", decode=tokenizer.decode)
    assert cuda.device.type == "cuda"
    greedy = GenerationRequest(prompt_token_ids=prompt, max_new_tokens=12, temperature=0.0)
    on_cpu, on_cuda = cpu.generate([greedy])[0], cuda.generate([greedy])[0]
    assert on_cuda.token_ids == on_cpu.token_ids
    assert on_cuda.logprobs == pytest.approx(on_cpu.logprobs, abs=1e-3)
    seeded = GenerationRequest(prompt_token_ids=prompt, max_new_tokens=12, seed=3, top_p=0.9)
    first, again = cuda.generate([seeded])[0], cuda.generate([seeded, greedy])[0]
    assert first.token_ids == again.token_ids
