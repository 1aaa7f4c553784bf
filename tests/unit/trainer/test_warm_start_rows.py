"""The trainer's warm start on a file dataset: each row's demonstration conversation,
rendered by the job's chat format, in the serving order; rows that cannot be rendered
are skipped and counted. Real: the tiny Qwen2 fixture's tokenizer and template, the
``datasets`` library on a jsonl in tmp."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from libra.chat.job import chat_format
from libra.data import open_job_dataset
from libra.jobspec import JobSpec, ToolSchema, parse_job_spec
from libra.models.hf import load_tokenizer
from libra.training.backend import JobBackend, _row_demonstrations
from tests.fixtures.data_files import chat_rows, write_jsonl

CALC = ToolSchema(name="calculator", description="Evaluate arithmetic.",
                  parameters_json=json.dumps({"type": "object", "properties": {
                      "expression": {"type": "string"}}}))


def file_spec(model: Path, path: Path, sft_steps: int = 1) -> JobSpec:
    spec = parse_job_spec(
        f'[model]\nkind = "hf"\npath = "{model}"\nmax_context_tokens = 512\n'
        f'[task]\nkind = "jsonl"\npath = "{path}"\nmessages_field = "messages"\n'
        'reference_field = "answer"\ndemonstration_field = "demo"\n'
        'tool_call_format = "hermes"\n'
        f"[algorithm]\nsft_steps = {sft_steps}\nsft_batch_size = 2\nprompts_per_step = 2\n")
    return dataclasses.replace(spec, tools=dataclasses.replace(spec.tools, schemas=[CALC]))


def rows_with_tool_calls(num_rows: int) -> list[dict]:
    rows = chat_rows(num_rows)
    for i, row in enumerate(rows):
        row["demo"] = [{"role": "user", "content": f"What is {i} * 3?"},
                       {"role": "assistant", "content": "", "tool_calls": [
                           {"name": "calculator", "arguments": {"expression": f"{i}*3"}}]},
                       {"role": "tool", "name": "calculator", "content": str(3 * i)},
                       {"role": "assistant", "content": f"The answer is {3 * i}."}]
    return rows


def test_row_demonstrations_render_each_rows_conversation_in_serving_order(
        hf_model_dir, tmp_path, datasets_cache) -> None:
    spec = file_spec(hf_model_dir("qwen2"), write_jsonl(tmp_path / "c.jsonl",
                                                        rows_with_tool_calls(5)))
    tokenizer = load_tokenizer(spec.model.path)
    examples, skipped = _row_demonstrations(spec, tokenizer, open_job_dataset(spec.task).train, 7)
    split = open_job_dataset(spec.task).train
    chat = chat_format(spec, tokenizer)
    expected = [chat.demonstration(split.draw(d).demonstration()) for d in range(7)]
    assert [(e.token_ids, e.loss_mask) for e in examples] == expected
    assert skipped == 0
    trained = tokenizer.decode([i for i, m in zip(*expected[0], strict=True) if m])
    assert "<tool_call>" in trained and "The answer is" in trained


def test_rows_without_a_demonstration_are_skipped_and_counted(
        hf_model_dir, tmp_path, datasets_cache) -> None:
    rows = rows_with_tool_calls(4)
    rows[2]["demo"] = None
    spec = file_spec(hf_model_dir("qwen2"), write_jsonl(tmp_path / "c.jsonl", rows))
    tokenizer = load_tokenizer(spec.model.path)
    examples, skipped = _row_demonstrations(spec, tokenizer, open_job_dataset(spec.task).train, 9)
    assert len(examples) == 9 and skipped == 1


def test_a_dataset_with_no_usable_demonstration_is_refused(
        hf_model_dir, tmp_path, datasets_cache) -> None:
    rows = rows_with_tool_calls(3)
    for row in rows:
        row["demo"] = [{"role": "user", "content": "hi"}, {"role": "assistant",
                                                           "tool_calls": [{"x": 1}]}]
    spec = file_spec(hf_model_dir("qwen2"), write_jsonl(tmp_path / "c.jsonl", rows))
    with pytest.raises(ValueError, match="no demonstration of the dataset renders"):
        _row_demonstrations(spec, load_tokenizer(spec.model.path),
                            open_job_dataset(spec.task).train, 4)


def test_warm_start_on_a_file_dataset_trains_and_reports_skips(
        hf_model_dir, tmp_path, datasets_cache) -> None:
    spec = file_spec(hf_model_dir("qwen2"), write_jsonl(tmp_path / "c.jsonl",
                                                        rows_with_tool_calls(4)))
    backend = JobBackend(spec, str(tmp_path / "model"), num_threads=1, device="cpu")
    stats = backend.warm_start()
    assert stats["sft_steps"] == 1 and stats["sft_rows_skipped"] == 0
    assert stats["sft_loss_first"] > 0
