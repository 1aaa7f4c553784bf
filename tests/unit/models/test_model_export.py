"""``export_hf`` and ``find_weights``: a published policy version -> HF directory.

Real: transformers, safetensors, the trainer's manifest writer (libra.weight_sync). A run
directory is laid out the way services/trainer/core.py lays it out: ``model/`` (config,
tokenizer) and ``weights/vNNNNNN.safetensors`` + manifest, the weights being a changed
state dict of the tiny fixture model (what training would publish).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from libra.errors import InvalidArgument, NotFound
from libra.models.export import export_hf, find_weights, published_versions
from libra.weight_sync import write_manifest

IDS = torch.tensor([[3, 41, 7, 200, 2, 19, 88, 5]])


def _trained_state(model_dir: Path, seed: int) -> dict[str, torch.Tensor]:
    """The model's full state dict (tied names included, as ``state_dict()`` has them),
    every float tensor moved a little: a policy version after some training."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _publish(run_dir: Path, version: int, state: dict[str, torch.Tensor],
             manifest: bool = True) -> Path:
    path = run_dir / "weights" / f"v{version:06d}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path))
    if manifest:
        write_manifest(path, version)
    return path


def _reference_logits(model_dir: Path, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """A model that loaded the published weights directly (what a rollout worker runs)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    with torch.no_grad():
        return model(IDS).logits


def _run_dir(hf_model_dir, tmp_path: Path, family: str) -> Path:
    run_dir = tmp_path / "runs" / "job-1"
    shutil.copytree(hf_model_dir(family), run_dir / "model")
    return run_dir


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_exported_dir_loads_and_matches_the_published_weights(hf_model_dir, tmp_path, family):
    run_dir = _run_dir(hf_model_dir, tmp_path, family)
    state = _trained_state(run_dir / "model", seed=1)
    weights = _publish(run_dir, 3, state)
    out = tmp_path / "exported"
    summary = export_hf(run_dir / "model", weights, out, version=3)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    with torch.no_grad():
        logits = model(IDS).logits
    assert torch.allclose(logits, _reference_logits(run_dir / "model", state))
    assert not torch.allclose(logits, _reference_logits(run_dir / "model", {}))
    assert summary.version == 3 and summary.architecture == type(model).__name__
    assert json.loads((out / "libra_export.json").read_text())["version"] == 3


def test_exported_model_generates_with_its_tokenizer_and_template(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    out = tmp_path / "exported"
    export_hf(run_dir / "model", _publish(run_dir, 1, _trained_state(run_dir / "model", 2)), out)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 12*7?"}],
                                           add_generation_prompt=True, return_tensors="pt",
                                           return_dict=True)
    out_ids = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out_ids.shape[1] > prompt["input_ids"].shape[1]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == (
        tokenizer.convert_tokens_to_ids("<|im_end|>"))


def test_tied_weights_are_exported_once_whichever_name_was_published(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    state = _trained_state(run_dir / "model", seed=3)
    only_head = {k: v for k, v in state.items() if k != "model.embed_tokens.weight"}
    out = tmp_path / "exported"
    export_hf(run_dir / "model", _publish(run_dir, 1, only_head), out)
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        assert "model.embed_tokens.weight" in fh.keys() and "lm_head.weight" not in fh.keys()
        assert torch.equal(fh.get_tensor("model.embed_tokens.weight"), state["lm_head.weight"])
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_untied_model_missing_lm_head_is_refused(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "qwen2")
    state = _trained_state(run_dir / "model", seed=4)
    del state["lm_head.weight"]
    with pytest.raises(InvalidArgument) as err:
        export_hf(run_dir / "model", _publish(run_dir, 1, state), tmp_path / "out")
    assert err.value.field == "weights" and "lm_head.weight is missing" in err.value.reason
    assert not (tmp_path / "out").exists()


def test_tied_copies_that_differ_are_refused(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    state = _trained_state(run_dir / "model", seed=5)
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    with pytest.raises(InvalidArgument, match="tied in the config but differ"):
        export_hf(run_dir / "model", _publish(run_dir, 1, state), tmp_path / "out")


def test_weights_of_another_shape_are_refused(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    state = _trained_state(run_dir / "model", seed=6)
    state["model.norm.weight"] = torch.ones(7)
    with pytest.raises(InvalidArgument) as err:
        export_hf(run_dir / "model", _publish(run_dir, 1, state), tmp_path / "out")
    assert "model.norm.weight has shape (7,), the config says (64,)" in err.value.reason


def test_unexpected_tensors_are_refused(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    state = {**_trained_state(run_dir / "model", seed=7), "value_head.weight": torch.ones(2)}
    with pytest.raises(InvalidArgument, match="no place for: value_head.weight"):
        export_hf(run_dir / "model", _publish(run_dir, 1, state), tmp_path / "out")


def test_damaged_weights_file_is_refused_by_its_manifest(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    weights = _publish(run_dir, 1, _trained_state(run_dir / "model", seed=8))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(InvalidArgument, match="does not match its manifest"):
        export_hf(run_dir / "model", weights, tmp_path / "out")


def test_not_a_safetensors_file_is_refused(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    weights = run_dir / "weights" / "v000001.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"not safetensors")
    with pytest.raises(InvalidArgument, match="not a readable safetensors file"):
        export_hf(run_dir / "model", weights, tmp_path / "out")


def test_non_empty_out_is_refused_without_force(hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path, "llama")
    weights = _publish(run_dir, 1, _trained_state(run_dir / "model", seed=9))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    with pytest.raises(InvalidArgument) as err:
        export_hf(run_dir / "model", weights, tmp_path / "out")
    assert err.value.field == "--out"
    export_hf(run_dir / "model", weights, tmp_path / "out", force=True)
    assert not (tmp_path / "out" / "x").exists()


# -- finding the version ----------------------------------------------------------------


def test_newest_complete_version_is_the_default(tmp_path):
    run_dir = tmp_path / "run"
    for version in (1, 2, 10):
        _publish(run_dir, version, {"w": torch.zeros(1)})
    _publish(run_dir, 11, {"w": torch.zeros(1)}, manifest=False)  # still being written
    assert sorted(published_versions(run_dir)) == [1, 2, 10, 11]
    assert find_weights(run_dir)[0] == 10
    assert find_weights(run_dir, 2) == (2, run_dir / "weights" / "v000002.safetensors")
    assert find_weights(run_dir, 11)[0] == 11


def test_unknown_version_names_the_published_ones(tmp_path):
    run_dir = tmp_path / "run"
    for version in (1, 2):
        _publish(run_dir, version, {"w": torch.zeros(1)})
    with pytest.raises(NotFound, match=r"version 7 is not published .*\(published: 1, 2\)"):
        find_weights(run_dir, 7)


def test_run_without_weights_or_run_dir_is_not_found(tmp_path):
    with pytest.raises(NotFound, match="does not exist"):
        find_weights(tmp_path / "missing")
    with pytest.raises(NotFound, match="holds no published weights"):
        find_weights(tmp_path)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_exported_logits_equal_the_engines_on_the_trainers_published_file(
        hf_model_dir, tmp_path, family):
    """The round trip a user makes: the trainer publishes (tied tensors once), a rollout
    engine serves that version, `libra export` writes it out; both see the same logits."""
    from libra.training.torch_backend import TorchTrainerBackend
    from services.rollout.torch_engine import TorchEngine

    run_dir = _run_dir(hf_model_dir, tmp_path, family)
    trainer_model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    with torch.no_grad():
        for param in trainer_model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(2)))
    backend = TorchTrainerBackend(trainer_model, pad_token_id=0, device="cpu")
    weights = run_dir / "weights" / "v000002.safetensors"
    weights.parent.mkdir(parents=True)
    backend.save_weights(str(weights))
    write_manifest(weights, 2)
    engine = TorchEngine.from_model_dir(str(run_dir / "model"), device="cpu")
    engine.load_weights(str(weights), 2)
    export_hf(run_dir / "model", weights, tmp_path / "exported", version=2)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").eval()
    with torch.no_grad():
        served, written = engine.model(IDS).logits, exported(IDS).logits
    assert torch.allclose(served, written, atol=1e-6)
    assert not torch.allclose(written, _reference_logits(run_dir / "model", {}))
