"""``inspect_model_dir`` and ``validate_model_for_job``: each bad model is refused naming
the field, before any weights are loaded.

Real: transformers (config, meta-device model, tokenizer, chat template), the job spec
parser. Model directories are the tiny random ones of tests/fixtures/hf_models.py, copied
and then damaged on purpose.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from libra.errors import InvalidArgument
from libra.jobspec import job_spec_from_dict
from libra.models.inspect import (
    ACTIVATION_MARGIN_FRACTION,
    dtype_problem,
    estimate_training_memory_bytes,
    inspect_model_dir,
    validate_model_for_job,
)

GIB = 2**30


def _spec(path: Path | str, **sections):
    data = {"model": {"kind": "hf", "path": str(path)}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return job_spec_from_dict(data)


def _copy(hf_model_dir, tmp_path: Path, family: str = "llama") -> Path:
    return Path(shutil.copytree(hf_model_dir(family), tmp_path / family))


def _edit_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def _refusal(spec, **kwargs) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        validate_model_for_job(spec, device="cpu", **kwargs)
    return err.value


# -- what a good directory reports ------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_parameters_are_counted_without_loading_weights(hf_model_dir, family):
    info = inspect_model_dir(hf_model_dir(family))
    model = AutoModelForCausalLM.from_pretrained(hf_model_dir(family))
    assert info.num_params == sum(p.numel() for p in model.parameters())
    assert info.architecture == type(model).__name__
    assert info.model_type == family
    assert info.param_bytes == info.num_params * 4 and info.dtype == "float32"


def test_llama_template_ignores_tools_and_qwen_template_renders_them(hf_model_dir):
    llama, qwen = inspect_model_dir(hf_model_dir("llama")), inspect_model_dir(hf_model_dir("qwen3"))
    assert llama.has_chat_template and not llama.template_renders_tools
    assert qwen.has_chat_template and qwen.template_renders_tools
    assert llama.template_error == "" and qwen.template_error == ""


def test_info_reports_context_eos_and_tying(hf_model_dir):
    info = inspect_model_dir(hf_model_dir("llama"))
    assert info.max_position_embeddings == 512
    assert info.eos_token_ids == [2] and info.tie_word_embeddings
    assert not inspect_model_dir(hf_model_dir("qwen2")).tie_word_embeddings


def test_training_memory_is_weights_grads_adamw_and_margin():
    # 1000 float32 params: 4 + 4 + 8 bytes each, plus the activation margin.
    assert estimate_training_memory_bytes(1000, 4) == int(
        16_000 * (1 + ACTIVATION_MARGIN_FRACTION))
    assert estimate_training_memory_bytes(1000, 2) == int(
        12_000 * (1 + ACTIVATION_MARGIN_FRACTION))


def test_bfloat16_halves_the_parameter_bytes(hf_model_dir):
    info = inspect_model_dir(hf_model_dir("llama"), dtype="bfloat16")
    assert info.dtype == "bfloat16" and info.param_bytes == info.num_params * 2


def test_a_good_model_passes_and_the_built_in_model_is_not_inspected(hf_model_dir):
    info = validate_model_for_job(_spec(hf_model_dir("qwen3"), task={
        "tool_call_format": "hermes"}, model={"tool_template": "model"}), device="cpu")
    assert info is not None and info.architecture == "Qwen3ForCausalLM"
    assert validate_model_for_job(job_spec_from_dict({}), device="cpu") is None


# -- refusals ---------------------------------------------------------------------------


def test_missing_path_is_refused(tmp_path):
    err = _refusal(_spec(tmp_path / "nope"))
    assert err.field == "model.path" and "does not exist" in err.reason


def test_file_path_is_refused(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"\0")
    err = _refusal(_spec(tmp_path / "model.bin"))
    assert err.field == "model.path" and "is not a directory" in err.reason


def test_directory_without_config_is_refused(tmp_path):
    err = _refusal(_spec(tmp_path))
    assert err.field == "model.path" and "has no config.json" in err.reason


def test_directory_without_weights_is_refused(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    (folder / "model.safetensors").unlink()
    err = _refusal(_spec(folder))
    assert "has no weights" in err.reason


def test_unknown_model_type_is_refused(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    _edit_config(folder, model_type="llama9000")
    err = _refusal(_spec(folder))
    assert err.field == "model.path"
    assert "model_type 'llama9000' is not an architecture transformers" in err.reason


def test_unknown_architecture_class_is_refused(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    _edit_config(folder, architectures=["MyLlamaForCausalLM"])
    err = _refusal(_spec(folder))
    assert "architectures names 'MyLlamaForCausalLM'" in err.reason


def test_model_type_without_a_causal_lm_is_refused(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    (folder / "config.json").write_text(json.dumps({"model_type": "vit"}))
    err = _refusal(_spec(folder))
    assert "model_type 'vit' has no causal LM" in err.reason


def test_unreadable_config_is_refused(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    (folder / "config.json").write_text("{not json")
    err = _refusal(_spec(folder))
    assert err.field == "model.path" and "config.json cannot be read" in err.reason


def test_directory_without_tokenizer_files_is_refused(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    (folder / "tokenizer.json").unlink()
    err = _refusal(_spec(folder))
    assert err.field == "model.path" and "has no tokenizer files" in err.reason


def _without_template(hf_model_dir, tmp_path) -> Path:
    folder = _copy(hf_model_dir, tmp_path)
    (folder / "chat_template.jinja").unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_no_chat_template_is_refused_for_the_hermes_format(hf_model_dir, tmp_path):
    folder = _without_template(hf_model_dir, tmp_path)
    assert not inspect_model_dir(folder).has_chat_template
    err = _refusal(_spec(folder, task={"tool_call_format": "hermes"}))
    assert err.field == "model.path" and "has no chat template" in err.reason
    assert "hermes" in err.reason
    assert validate_model_for_job(_spec(folder), device="cpu") is not None  # arith: fine


def test_broken_chat_template_is_refused_for_the_hermes_format(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    (folder / "chat_template.jinja").write_text(
        "{{ raise_exception('System role not supported') }}")
    info = inspect_model_dir(folder)
    assert info.has_chat_template and "System role not supported" in info.template_error
    err = _refusal(_spec(folder, task={"tool_call_format": "hermes"}))
    assert "fails on a probe conversation" in err.reason


def test_model_tool_template_needs_a_template_that_renders_tools(hf_model_dir):
    spec = _spec(hf_model_dir("llama"), task={"tool_call_format": "hermes"},
                 model={"tool_template": "model"})
    err = _refusal(spec)
    assert err.field == "model.tool_template" and "ignores them" in err.reason
    auto = _spec(hf_model_dir("llama"), task={"tool_call_format": "hermes"})
    assert validate_model_for_job(auto, device="cpu") is not None


def test_context_longer_than_the_model_is_refused(hf_model_dir):
    err = _refusal(_spec(hf_model_dir("llama"), model={"max_context_tokens": 4096}))
    assert err.field == "model.max_context_tokens" and "(512)" in err.reason


def test_model_larger_than_the_memory_budget_names_both_numbers(hf_model_dir):
    spec = _spec(hf_model_dir("llama"))
    err = _refusal(spec, memory_bytes=1_000_000)
    need = inspect_model_dir(hf_model_dir("llama")).training_memory_bytes
    assert err.field == "model.path"
    assert f"needs about {need / GIB:.1f} GiB" in err.reason
    assert "this machine has 0.0 GiB of memory budget" in err.reason


def test_70b_config_is_refused_against_this_machines_ram(hf_model_dir, tmp_path):
    folder = _copy(hf_model_dir, tmp_path)
    _edit_config(folder, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                 num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                 vocab_size=128256, tie_word_embeddings=False)
    err = _refusal(_spec(folder))
    assert "70,553.7M parameters needs about" in err.reason
    assert "GiB of RAM" in err.reason


@pytest.mark.parametrize(("dtype", "device", "native", "refused"), [
    ("bfloat16", "cpu", False, False),   # CPU computes bf16 everywhere (slower w/o AMX)
    ("auto", "cpu", False, False),       # auto = float32 on CPU
    ("float32", "cuda", False, False),
    ("bfloat16", "cuda", True, False),
    ("bfloat16", "cuda", False, True),   # pre-Ampere GPU
    ("auto", "cuda", False, True),       # auto = bfloat16 on CUDA
])
def test_dtype_problem(dtype, device, native, refused):
    problem = dtype_problem(dtype, device, native)
    assert (problem is not None) == refused
    if refused:
        assert "compute capability >= 8.0" in problem and "float32" in problem
