"""The shipped example datasets (deploy/data/, written by scripts/make_example_data.py)
and the calc-words job spec (deploy/configs/smollm2-calc-jsonl.toml): the files are what the script
writes, the spec parses, its dataset passes the submit check, and it is the built-in
calc-words example with prompts read from a file. Nothing is trained here."""

from __future__ import annotations

import dataclasses
import importlib.util
import tomllib
from pathlib import Path

import pytest

from libra.data import check_job_dataset, open_job_dataset
from libra.tasks import TASK_SYSTEM_PROMPTS, load_problems
from libra_cli.main import load_spec

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "deploy" / "configs"


def _script():
    spec = importlib.util.spec_from_file_location(
        "make_example_data", ROOT / "scripts" / "make_example_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def jsonl_spec(monkeypatch):
    monkeypatch.chdir(ROOT)  # the spec's relative paths resolve against the current dir
    return load_spec(CONFIGS / "smollm2-calc-jsonl.toml", [])[1]


def test_shipped_files_are_what_the_script_writes(tmp_path: Path) -> None:
    written = _script().write_all(tmp_path)
    assert len(written) == 7
    for path in written:
        shipped = ROOT / "deploy" / "data" / path.name
        assert shipped.read_bytes() == path.read_bytes(), path.name


def test_the_jsonl_spec_is_the_builtin_example_but_for_its_task(jsonl_spec) -> None:
    builtin = load_spec(CONFIGS / "smollm2-calc.toml", [])[1]
    assert dataclasses.replace(jsonl_spec, name=builtin.name, task=builtin.task) == builtin
    for name in ("max_turns", "max_new_tokens_per_turn", "tool_call_format"):
        assert getattr(jsonl_spec.task, name) == getattr(builtin.task, name)
    assert jsonl_spec.task.system_prompt == TASK_SYSTEM_PROMPTS["calc-words"]
    raw = tomllib.loads((CONFIGS / "smollm2-calc-jsonl.toml").read_text())
    assert raw["task"]["kind"] == "jsonl"


def test_its_dataset_passes_the_submit_check(jsonl_spec, datasets_cache) -> None:
    summary = check_job_dataset(jsonl_spec)
    assert (summary.kind, summary.num_train_rows, summary.num_eval_rows) == ("jsonl", 384, 64)


def test_its_rows_are_the_builtin_problems(jsonl_spec, datasets_cache) -> None:
    dataset = open_job_dataset(jsonl_spec.task)
    problems = load_problems("calc-words", 0, 384)
    for index in (0, 17, 383):
        row = dataset.train.row(index)
        assert (row.prompt_text, row.reference) == (problems[index].prompt,
                                                     str(problems[index].answer))
        assert row.demonstration()[-1]["role"] == "assistant"
    assert dataset.eval.row(0).prompt_text == load_problems("calc-words", 1, 1)[0].prompt
