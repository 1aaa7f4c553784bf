"""``algorithm.init_from`` at submit: resolving a job id or a directory to a verified
checkpoint, and refusing one whose model differs from ``[model]`` (names what differs).
Real checkpoints written by the trainer's own code (tests/fixtures/checkpoints.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from libra.errors import InvalidArgument
from libra.jobspec import job_spec_from_dict
from libra.models.init_check import check_init_from, safetensors_shapes, shape_differences
from libra.models.tiny import VOCAB_SIZE
from libra.run_dir import resolve_init_from
from libra.weight_sync import sha256_file
from tests.fixtures.checkpoints import tiny_spec, write_job_checkpoint


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run root with job ``src`` (checkpoints at steps 2 and 4 of the small tiny model)."""
    root = tmp_path_factory.mktemp("runs")
    write_job_checkpoint(root / "src", tiny_spec(), step=2)
    write_job_checkpoint(root / "src", tiny_spec(), step=4)
    return root


def refused(value: str, run_root: Path) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        resolve_init_from(value, run_root)
    assert err.value.field == "algorithm.init_from"
    return err.value


# -- resolving -----------------------------------------------------------------------------

def test_a_job_id_is_that_jobs_newest_checkpoint(runs: Path) -> None:
    ckpt = resolve_init_from("src", runs)
    assert ckpt.path == runs / "src" / "checkpoints" / "step_000004" and ckpt.step == 4


def test_a_run_dir_path_is_its_newest_checkpoint(runs: Path, tmp_path: Path) -> None:
    assert resolve_init_from(str(runs / "src"), tmp_path).step == 4


def test_a_checkpoint_folder_is_taken_as_is(runs: Path, tmp_path: Path) -> None:
    folder = runs / "src" / "checkpoints" / "step_000002"
    assert resolve_init_from(str(folder), tmp_path).path == folder


def test_an_unknown_job_id_is_refused(runs: Path) -> None:
    assert "no job 'nope'" in refused("nope", runs).reason


def test_a_missing_directory_is_refused(tmp_path: Path) -> None:
    assert "is not a directory" in refused(str(tmp_path / "gone"), tmp_path).reason


def test_a_run_dir_without_checkpoints_is_refused(tmp_path: Path) -> None:
    (tmp_path / "job" / "checkpoints").mkdir(parents=True)
    assert "holds no checkpoint" in refused("job", tmp_path).reason


def test_a_directory_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stuff").mkdir()
    assert "neither a checkpoint folder" in refused(str(tmp_path / "stuff"), tmp_path).reason


def test_a_checkpoint_that_does_not_verify_is_refused_naming_the_file(
        runs: Path, tmp_path: Path) -> None:
    shutil.copytree(runs / "src", tmp_path / "src")
    model = tmp_path / "src" / "checkpoints" / "step_000004" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:-4] + b"\0\0\0\0")
    reason = refused("src", tmp_path).reason
    assert "does not verify" in reason and "step_000004/model.safetensors" in reason


# -- compatibility -------------------------------------------------------------------------

def test_the_same_model_fits(runs: Path) -> None:
    assert check_init_from(tiny_spec("src"), runs).step == 4


def test_a_tiny_model_of_another_hidden_size_is_refused_naming_the_shapes(runs: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_init_from(tiny_spec("src", hidden_size=64), runs)
    assert err.value.field == "algorithm.init_from"
    assert (f"model.embed_tokens.weight ({VOCAB_SIZE}, 32) != ({VOCAB_SIZE}, 64)"
            in err.value.reason)


def test_a_deeper_model_is_refused_naming_the_missing_layer(runs: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        check_init_from(tiny_spec("src", num_layers=2), runs)
    assert "missing: model.layers.1." in err.value.reason


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_an_hf_model_is_refused_for_a_tiny_llama_checkpoint(
        runs: Path, hf_model_dir, family: str) -> None:
    spec = job_spec_from_dict({"model": {"kind": "hf", "path": str(hf_model_dir(family))},
                               "algorithm": {"init_from": "src"}})
    with pytest.raises(InvalidArgument) as err:
        check_init_from(spec, runs)
    reason = err.value.reason
    assert "does not fit [model] (kind 'hf'" in reason and "shapes (checkpoint != model)" in reason
    if family == "qwen3":
        assert "architecture LlamaForCausalLM != Qwen3ForCausalLM" in reason


def test_a_model_file_that_is_not_safetensors_is_refused(runs: Path, tmp_path: Path) -> None:
    shutil.copytree(runs / "src", tmp_path / "src")
    folder = tmp_path / "src" / "checkpoints" / "step_000004"
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    # Recorded in meta.json: the checkpoint verifies, only the file's format is bad.
    data = json.loads((folder / "meta.json").read_text())
    data["files"]["model.safetensors"] = sha256_file(folder / "model.safetensors")
    (folder / "meta.json").write_text(json.dumps(data))
    with pytest.raises(InvalidArgument) as err:
        check_init_from(tiny_spec("src"), tmp_path)
    assert "is not a readable safetensors file" in err.value.reason


def test_header_shapes_are_read_without_the_weights(runs: Path) -> None:
    shapes = safetensors_shapes(runs / "src" / "checkpoints" / "step_000004" / "model.safetensors")
    assert shapes["model.embed_tokens.weight"] == (VOCAB_SIZE, 32)


def test_differences_name_at_most_three_of_each_kind() -> None:
    have = {f"w{i}": (1,) for i in range(5)}
    (problem,) = shape_differences(have, {})
    assert problem == "unexpected: w0, w1, w2 (+2 more)"


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # tied and untied embeddings
def test_an_hf_job_fits_a_checkpoint_of_the_same_hf_model(
        hf_model_dir, tmp_path: Path, family: str) -> None:
    spec = job_spec_from_dict({"model": {"kind": "hf", "path": str(hf_model_dir(family))},
                               "algorithm": {"init_from": "hf-src", "sft_steps": 0}})
    write_job_checkpoint(tmp_path / "hf-src", spec)
    assert check_init_from(spec, tmp_path).step == 4
