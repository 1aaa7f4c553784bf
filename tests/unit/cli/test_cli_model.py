"""``libra model import|inspect`` and ``libra export`` through the CLI entry point.

Real: the CLI parser and commands, the importer and exporter, transformers. GGUF files
are written here; run directories are laid out as the trainer lays them out.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from libra.weight_sync import write_manifest
from libra_cli.main import main
from tests.fixtures.gguf_files import gguf_from_hf_llama


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def tiny_gguf(hf_model_dir, tmp_path_factory) -> Path:
    return gguf_from_hf_llama(hf_model_dir("llama"), tmp_path_factory.mktemp("g") / "t.gguf")


def test_import_json_summary_and_progress(capsys, tiny_gguf, tmp_path):
    code, out, err = run_cli(capsys, "model", "import", "--gguf", str(tiny_gguf),
                             "--out", str(tmp_path / "m"), "--json")
    summary = json.loads(out)
    assert code == 0
    assert {"architecture", "num_params", "out", "seconds"} <= set(summary)
    assert summary["architecture"] == "LlamaForCausalLM"
    assert summary["out"] == str((tmp_path / "m").resolve())
    assert "[import] done" in err
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "m", local_files_only=True)


def test_import_missing_gguf_exits_2_naming_the_option(capsys, tmp_path):
    code, out, err = run_cli(capsys, "model", "import", "--gguf", str(tmp_path / "x.gguf"),
                             "--out", str(tmp_path / "m"))
    assert code == 2 and out == ""
    assert "InvalidArgument: --gguf:" in err and "does not exist" in err


def test_import_gguf_needs_out(capsys, tiny_gguf):
    code, _, err = run_cli(capsys, "model", "import", "--gguf", str(tiny_gguf))
    assert code == 2 and "--out: required with --gguf" in err


def test_import_into_non_empty_dir_exits_2_unless_forced(capsys, tiny_gguf, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("mine")
    code, _, err = run_cli(capsys, "model", "import", "--gguf", str(tiny_gguf),
                           "--out", str(tmp_path / "m"))
    assert code == 2 and "--force" in err
    code, _, _ = run_cli(capsys, "model", "import", "--gguf", str(tiny_gguf),
                         "--out", str(tmp_path / "m"), "--force")
    assert code == 0 and not (tmp_path / "m" / "notes.txt").exists()


def test_inspect_json(capsys, hf_model_dir):
    code, out, _ = run_cli(capsys, "model", "inspect", str(hf_model_dir("qwen3")), "--json")
    info = json.loads(out)
    assert code == 0
    assert (info["architecture"], info["template_renders_tools"]) == ("Qwen3ForCausalLM", True)
    assert info["training_memory_bytes"] > info["param_bytes"] > 0


def test_inspect_bad_dir_exits_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "model", "inspect", str(tmp_path))
    assert code == 2 and "model.path:" in err and "no config.json" in err


# -- export -----------------------------------------------------------------------------


def _run_dir(hf_model_dir, root: Path, versions: tuple[int, ...] = (1, 2)) -> Path:
    """A run directory as the trainer writes it; version N adds N/100 to every weight."""
    run_dir = root / "job-abc"
    shutil.copytree(hf_model_dir("llama"), run_dir / "model")
    model = AutoModelForCausalLM.from_pretrained(run_dir / "model")
    (run_dir / "weights").mkdir()
    for version in versions:
        state = {k: v + version / 100 for k, v in model.state_dict().items()
                 if k != "lm_head.weight"}  # tied: published once
        path = run_dir / "weights" / f"v{version:06d}.safetensors"
        save_file(state, str(path))
        write_manifest(path, version)
    return run_dir


def _norm_offset(out: Path) -> float:
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    return model.model.norm.weight[0].item() - 1.0  # RMSNorm weights start at 1


def test_export_run_dir_newest_version(capsys, hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path)
    code, out, err = run_cli(capsys, "export", "--run-dir", str(run_dir),
                             "--out", str(tmp_path / "out"), "--json")
    assert code == 0 and json.loads(out)["version"] == 2
    assert "version 2 (v000002.safetensors)" in err
    assert _norm_offset(tmp_path / "out") == pytest.approx(0.02)


def test_export_job_id_under_the_run_root_with_version(capsys, hf_model_dir, tmp_path):
    _run_dir(hf_model_dir, tmp_path / "runs")
    code, _, _ = run_cli(capsys, "--run-root", str(tmp_path / "runs"), "export", "job-abc",
                         "--version", "1", "--out", str(tmp_path / "out"))
    assert code == 0 and _norm_offset(tmp_path / "out") == pytest.approx(0.01)
    with torch.no_grad():
        ids = torch.tensor([[1, 2, 3]])
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
        assert model.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 6)


def test_export_unknown_version_exits_2(capsys, hf_model_dir, tmp_path):
    run_dir = _run_dir(hf_model_dir, tmp_path)
    code, _, err = run_cli(capsys, "export", "--run-dir", str(run_dir), "--version", "9",
                           "--out", str(tmp_path / "out"))
    assert code == 2 and "version 9 is not published" in err and "(published: 1, 2)" in err
    assert not (tmp_path / "out").exists()


def test_export_unknown_job_without_a_stack_exits_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--run-root", str(tmp_path), "export", "job-nope",
                           "--out", str(tmp_path / "out"))
    assert code == 2 and "no stack is running" in err and "--run-dir" in err


def test_export_needs_a_job_or_run_dir(capsys, tmp_path):
    code, _, err = run_cli(capsys, "export", "--out", str(tmp_path / "out"))
    assert code == 2 and "give a job id, or --run-dir DIR" in err
