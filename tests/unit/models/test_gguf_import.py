"""``import_gguf``: GGUF -> HF directory, and each refusal before any loading.

Real: the ``gguf`` writer and reader, transformers' GGUF converter, safetensors. The GGUF
files are written here (tests/fixtures/gguf_files.py); the tiny Llama comes from the
``hf_model_dir`` fixture, so a round trip can be compared logit for logit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from transformers import AutoModelForCausalLM, AutoTokenizer

from libra.errors import InvalidArgument
from libra.models.gguf_import import (
    check_convertible,
    import_gguf,
    read_gguf_header,
    supported_tensor_types,
)
from tests.fixtures.gguf_files import gguf_from_hf_llama, write_gguf

IDS = torch.tensor([[5, 17, 30, 2, 99, 150, 7]])


def _logits(path: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    with torch.no_grad():
        return model(IDS).logits


@pytest.fixture(scope="module")
def tiny_gguf(hf_model_dir, tmp_path_factory) -> Path:
    return gguf_from_hf_llama(hf_model_dir("llama"),
                              tmp_path_factory.mktemp("gguf") / "tiny-llama.f32.gguf")


def test_round_trip_of_float32_gguf_gives_the_same_logits(hf_model_dir, tiny_gguf, tmp_path):
    out = tmp_path / "imported"
    summary = import_gguf(tiny_gguf, out)
    assert (summary.architecture, summary.model_type) == ("LlamaForCausalLM", "llama")
    assert summary.num_params == sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(
        hf_model_dir("llama")).parameters())
    assert torch.equal(_logits(out), _logits(hf_model_dir("llama")))


def test_imported_dir_has_tokenizer_template_and_eos(hf_model_dir, tiny_gguf, tmp_path):
    out = tmp_path / "imported"
    import_gguf(tiny_gguf, out)
    original = AutoTokenizer.from_pretrained(hf_model_dir("llama"))
    imported = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "What is 37+58*2? <tool_call> calculator<|im_end|>"
    assert imported(text)["input_ids"] == original(text)["input_ids"]
    assert imported.chat_template == original.chat_template
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == original.convert_tokens_to_ids("<|im_end|>")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True


def test_tied_embeddings_are_stored_once(tiny_gguf, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "imported"
    import_gguf(tiny_gguf, out)
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        names = set(fh.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names


def test_q8_0_gguf_is_dequantised_close_to_the_original(hf_model_dir, tmp_path):
    path = gguf_from_hf_llama(hf_model_dir("llama"), tmp_path / "tiny.q8_0.gguf",
                              GGMLQuantizationType.Q8_0)
    summary = import_gguf(path, tmp_path / "imported")
    assert summary.tensor_types["Q8_0"] > 0
    original, imported = _logits(hf_model_dir("llama")), _logits(tmp_path / "imported")
    assert not torch.equal(original, imported)  # really went through 8-bit blocks
    assert torch.allclose(original, imported, atol=0.05 * original.abs().max().item())


def test_progress_reports_each_stage(tiny_gguf, tmp_path):
    lines: list[str] = []
    import_gguf(tiny_gguf, tmp_path / "imported", progress=lines.append)
    assert any("F32 x" in line for line in lines)
    assert lines[-1].startswith("[import] done: LlamaForCausalLM")


# -- refusals (all before transformers loads anything) ----------------------------------


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(InvalidArgument) as err:
        import_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    assert err.value.field == "--gguf" and "does not exist" in err.value.reason


def test_directory_is_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="is not a file"):
        read_gguf_header(tmp_path)


def test_text_file_is_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("this is a README, not a model\n")
    with pytest.raises(InvalidArgument) as err:
        import_gguf(path, tmp_path / "out")
    assert "is not a GGUF file" in err.value.reason and "b'this'" in err.value.reason
    assert not (tmp_path / "out").exists()


def test_truncated_gguf_is_refused(tmp_path):
    path = tmp_path / "cut.gguf"
    path.write_bytes(write_gguf(tmp_path / "whole.gguf").read_bytes()[:40])
    with pytest.raises(InvalidArgument, match="not a readable GGUF file"):
        read_gguf_header(path)


def test_unsupported_tensor_type_is_named_with_the_supported_ones(tmp_path):
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_1]
    path = write_gguf(tmp_path / "q8_1.gguf", tensors={
        "token_embd.weight": (np.zeros((8, 32), dtype=np.float32), None),
        "blk.0.attn_q.weight": (np.zeros((4, 64 // block * type_size), dtype=np.uint8),
                                GGMLQuantizationType.Q8_1),
        "blk.0.attn_k.weight": (np.zeros((4, 64 // block * type_size), dtype=np.uint8),
                                GGMLQuantizationType.Q8_1)})
    with pytest.raises(InvalidArgument) as err:
        import_gguf(path, tmp_path / "out")
    assert err.value.field == "--gguf"
    assert "Q8_1 (2 tensors) cannot be dequantised" in err.value.reason
    assert "supported: F32, F16, Q4_0, Q4_1" in err.value.reason
    assert "Q8_1" not in supported_tensor_types("llama")


def test_unsupported_architecture_is_named(tmp_path):
    header = read_gguf_header(write_gguf(tmp_path / "rwkv.gguf", architecture="rwkv7"))
    with pytest.raises(InvalidArgument) as err:
        check_convertible(header)
    assert "architecture 'rwkv7' is not one transformers converts" in err.value.reason
    assert "llama" in err.value.reason and "qwen3" in err.value.reason


def test_header_is_read_without_the_tensor_data(tmp_path):
    header = read_gguf_header(write_gguf(tmp_path / "h.gguf"))
    assert (header.architecture, header.name, header.num_tensors) == ("llama", "test model", 1)
    assert header.tensor_types == {"F32": 1} and header.eos_token_ids == [2]


def test_non_empty_out_dir_is_refused_without_force(tiny_gguf, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(InvalidArgument) as err:
        import_gguf(tiny_gguf, out)
    assert err.value.field == "--out" and "--force" in err.value.reason
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_force_replaces_the_out_dir_and_leaves_no_temp_dirs(tiny_gguf, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    import_gguf(tiny_gguf, out, force=True)
    assert not (out / "stale.txt").exists() and (out / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_empty_out_dir_is_used(tiny_gguf, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    import_gguf(tiny_gguf, out)
    assert (out / "config.json").is_file()


def test_out_that_is_a_file_is_refused(tiny_gguf, tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(InvalidArgument, match="is not a directory"):
        import_gguf(tiny_gguf, tmp_path / "out", force=True)
