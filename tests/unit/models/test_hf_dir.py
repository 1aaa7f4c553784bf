"""hf_dir: the atomic output directory and tied-weight handling shared by import/export.

Real: the file system (tmp_path), transformers models built on the meta device.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from libra.errors import InvalidArgument
from libra.models.hf_dir import atomic_output_dir, drop_tied_copies, tied_groups


def test_error_inside_leaves_the_old_directory_and_no_temp_dir(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_output_dir(out, force=True) as tmp:
        (tmp / "half.bin").write_bytes(b"\0" * 10)
        raise RuntimeError("disk full")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert [p.name for p in out.iterdir()] == ["old.txt"]


def test_success_swaps_in_the_new_directory(tmp_path):
    out = tmp_path / "deep" / "out"
    with atomic_output_dir(out, force=False) as tmp:
        assert tmp.parent == out.parent and tmp != out
        (tmp / "config.json").write_text("{}")
        assert not out.exists()  # invisible until complete
    assert [p.name for p in out.iterdir()] == ["config.json"]
    assert [p.name for p in out.parent.iterdir()] == ["out"]


def test_non_empty_directory_needs_force(tmp_path):
    (tmp_path / "x").write_text("x")
    with pytest.raises(InvalidArgument) as err, atomic_output_dir(tmp_path, force=False):
        pass
    assert err.value.field == "--out"


@pytest.mark.parametrize(("family", "groups"), [
    ("llama", [["model.embed_tokens.weight", "lm_head.weight"]]),
    ("qwen2", []),
])
def test_tied_groups_put_the_canonical_name_first(hf_model_dir, family, groups):
    config = AutoConfig.from_pretrained(hf_model_dir(family))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert tied_groups(model) == groups
    state = drop_tied_copies(model.state_dict(), tied_groups(model))
    assert ("lm_head.weight" in state) == (family == "qwen2")
    assert "model.embed_tokens.weight" in state
