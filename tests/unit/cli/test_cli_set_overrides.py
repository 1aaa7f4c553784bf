"""``libra run|submit SPEC --set section.key=value``: overrides are validated like the
file before anything starts, and a relative ``model.path`` becomes absolute.

Real: the CLI parser, spec_overrides.apply_overrides and the spec validation. "Nothing started"
is observed on disk: ``libra run`` creates ``RUN_ROOT/.libra`` as its first act of
starting the stack, and ``submit`` is given a coordinator address nothing listens on.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libra_cli.main import load_spec, main

SPEC = 'name = "cli"\n[algorithm]\nnum_steps = 3\n'
NOBODY = "127.0.0.1:9"  # the discard port: nothing answers gRPC there


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(SPEC)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _run(capsys, tmp_path: Path, spec_file: Path, *sets: str) -> tuple[int, str]:
    argv = ["--run-root", str(tmp_path / "runs"), "run", str(spec_file)]
    for item in sets:
        argv += ["--set", item]
    code, out, err = run_cli(capsys, *argv)
    assert out == ""
    assert not (tmp_path / "runs" / ".libra").exists(), "the stack was started"
    return code, err


def test_run_with_unknown_key_exits_2_before_starting(capsys, tmp_path, spec_file):
    code, err = _run(capsys, tmp_path, spec_file, "algorithm.num_stepz=3")
    assert code == 2
    assert "InvalidArgument: algorithm.num_stepz: unknown field (known:" in err


def test_run_with_wrong_type_exits_2_before_starting(capsys, tmp_path, spec_file):
    code, err = _run(capsys, tmp_path, spec_file, "algorithm.num_steps=ten")
    assert code == 2 and "algorithm.num_steps: must be int, got str" in err


def test_run_with_out_of_range_value_exits_2(capsys, tmp_path, spec_file):
    code, err = _run(capsys, tmp_path, spec_file, "algorithm.num_steps=1",
                     "algorithm.clip_eps=3.0")
    assert code == 2 and "algorithm.clip_eps: must be in (0, 1)" in err


def test_run_with_malformed_override_exits_2(capsys, tmp_path, spec_file):
    code, err = _run(capsys, tmp_path, spec_file, "num_steps")
    assert code == 2 and "--set: 'num_steps' is not SECTION.KEY=VALUE" in err


def test_run_with_a_missing_model_exits_2_before_starting(capsys, tmp_path, spec_file):
    code, err = _run(capsys, tmp_path, spec_file, "model.kind=hf",
                     f"model.path={tmp_path / 'no-model'}")
    assert code == 2 and "model.path:" in err and "does not exist" in err


def test_run_with_a_missing_spec_file_exits_2(capsys, tmp_path):
    code, err = _run(capsys, tmp_path, tmp_path / "nope.toml")
    assert code == 2 and "JOB:" in err and "is not a file" in err


def test_submit_with_bad_override_exits_2_without_calling_the_coordinator(capsys, spec_file):
    code, out, err = run_cli(capsys, "--coordinator", NOBODY, "submit", str(spec_file),
                             "--set", "tools.enabled=[\"rm -rf\"]")
    assert code == 2 and out == ""
    assert "tools.enabled[0]: 'rm -rf' is not a plugin name" in err


def test_overrides_apply_in_order_and_list_items_by_index(spec_file):
    data, spec = load_spec(spec_file, ["algorithm.num_steps=7", "algorithm.num_steps=9",
                                       "layout.buckets=[{name = \"only\", max_tokens = 64}]",
                                       "layout.buckets[0].max_batch_size=2"])
    assert spec.algorithm.num_steps == 9 and data["algorithm"]["num_steps"] == 9
    assert [(b.name, b.max_tokens, b.max_batch_size) for b in spec.layout.buckets] == [
        ("only", 64, 2)]


def test_relative_model_path_is_made_absolute_against_the_cwd(spec_file, tmp_path,
                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    data, spec = load_spec(spec_file, ["model.kind=hf", "model.path=models/m"])
    assert spec.model.path == str(tmp_path / "models" / "m")
    assert data["model"]["path"] == spec.model.path


def test_absolute_model_path_is_kept(spec_file, tmp_path):
    _, spec = load_spec(spec_file, ["model.kind=hf", f"model.path={tmp_path}/m"])
    assert spec.model.path == f"{tmp_path}/m"


def test_relative_dataset_paths_resolve_against_the_current_directory(
        tmp_path: Path, monkeypatch) -> None:
    spec_file = tmp_path / "job.toml"
    spec_file.write_text('[task]\nkind = "jsonl"\npath = "data/d.jsonl"\n'
                         'eval_path = "data/e.jsonl"\nprompt_field = "q"\nreference_field = "a"\n'
                         "[algorithm]\nsft_steps = 0\n")
    monkeypatch.chdir(tmp_path)
    data, spec = load_spec(spec_file, [])
    assert spec.task.path == str(tmp_path / "data" / "d.jsonl")
    assert data["task"]["eval_path"] == str(tmp_path / "data" / "e.jsonl")


def test_relative_search_corpus_files_resolve_against_the_current_directory(
        spec_file, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    data, spec = load_spec(spec_file, ['tools.search_corpus=["c.txt", "/abs/d.txt"]'])
    assert spec.tools.search_corpus == [str(tmp_path / "c.txt"), "/abs/d.txt"]
    assert data["tools"]["search_corpus"] == spec.tools.search_corpus


def test_init_from_directory_is_made_absolute_and_a_job_id_is_kept(spec_file, tmp_path,
                                                                   monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _, spec = load_spec(spec_file, ["algorithm.init_from=runs/job-a"])
    assert spec.algorithm.init_from == str(tmp_path / "runs" / "job-a")
    _, spec = load_spec(spec_file, ["algorithm.init_from=job-a"])
    assert spec.algorithm.init_from == "job-a"
