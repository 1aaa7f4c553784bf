"""Submit-time validation of a job's dataset (libra/data/check.py): every bad input is
refused with InvalidArgument naming the spec field (and the row where there is one).
Real: the ``datasets`` library on small files in tmp."""

from __future__ import annotations

import pytest

from libra.data import check as check_module
from libra.data import check_job_dataset, open_job_dataset
from libra.errors import InvalidArgument
from libra.jobspec import JobSpec, parse_job_spec
from tests.fixtures.data_files import (
    chat_rows,
    word_rows,
    write_jsonl,
    write_parquet,
)


def spec_for(path, extra: str = "", kind: str = "jsonl", algorithm: str = "") -> JobSpec:
    return parse_job_spec(
        f'[task]\nkind = "{kind}"\npath = "{path}"\nprompt_field = "question"\n'
        f'reference_field = "answer"\n{extra}\n'
        f"[algorithm]\nsft_steps = 0\nprompts_per_step = 2\nnum_steps = 5\n{algorithm}")


def chat_spec(path, extra: str = "") -> JobSpec:
    return parse_job_spec(
        f'[task]\nkind = "jsonl"\npath = "{path}"\nmessages_field = "messages"\n'
        f'reference_field = "answer"\ntool_call_format = "hermes"\n{extra}\n'
        '[model]\nkind = "hf"\npath = "m"\n[algorithm]\nsft_steps = 0\nprompts_per_step = 2\n')


def refused(spec: JobSpec) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        check_job_dataset(spec)
    return err.value


def test_good_dataset_passes_with_its_row_counts(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(20))
    summary = check_job_dataset(spec_for(path, "eval_fraction = 0.25"))
    assert (summary.kind, summary.num_train_rows, summary.num_eval_rows) == ("jsonl", 15, 5)


def test_builtin_task_passes() -> None:
    summary = check_job_dataset(parse_job_spec("[task]\nnum_prompts = 64\n"))
    assert (summary.kind, summary.num_train_rows, summary.num_eval_rows) == ("arith", 64, 0)


def test_missing_file_is_refused(tmp_path, datasets_cache) -> None:
    err = refused(spec_for(tmp_path / "missing.jsonl"))
    assert err.field == "task.path" and "does not exist" in err.reason


def test_folder_given_as_jsonl_is_refused(tmp_path, datasets_cache) -> None:
    err = refused(spec_for(tmp_path))
    assert err.field == "task.path" and "is not a file" in err.reason


def test_file_given_as_hf_dataset_is_refused(tmp_path, datasets_cache) -> None:
    err = refused(spec_for(write_jsonl(tmp_path / "d.jsonl", word_rows(3)), kind="hf-dataset"))
    assert err.field == "task.path" and "save_to_disk" in err.reason


def test_text_file_given_as_jsonl_is_refused(tmp_path, datasets_cache) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("question,answer\nwhat,4\n")
    err = refused(spec_for(path))
    assert err.field == "task.path" and "does not read as jsonl" in err.reason


def test_jsonl_given_as_parquet_is_refused(tmp_path, datasets_cache) -> None:
    err = refused(spec_for(write_jsonl(tmp_path / "d.jsonl", word_rows(3)), kind="parquet"))
    assert err.field == "task.path" and "does not read as parquet" in err.reason


def test_folder_that_is_not_a_saved_dataset_is_refused(tmp_path, datasets_cache) -> None:
    err = refused(spec_for(tmp_path, kind="hf-dataset"))
    assert err.field == "task.path" and "does not read as hf-dataset" in err.reason


def test_empty_file_is_refused(tmp_path, datasets_cache) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("")
    err = refused(spec_for(path))
    assert err.field == "task.path" and "empty" in err.reason


def test_dataset_without_rows_is_refused(tmp_path, datasets_cache) -> None:
    err = refused(spec_for(_no_rows(tmp_path / "d.parquet"), kind="parquet"))
    assert err.field == "task.path" and "has no rows" in err.reason


def test_saved_dataset_without_rows_is_refused(tmp_path, datasets_cache) -> None:
    import datasets

    datasets.Dataset.from_list(word_rows(2)).select([]).save_to_disk(str(tmp_path / "e"))
    err = refused(spec_for(tmp_path / "e", kind="hf-dataset"))
    assert err.field == "task.path"


def test_mapped_column_absent_names_field_and_lists_columns(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"q": "x", "answer": "1"}] * 3)
    err = refused(spec_for(path))
    assert err.field == "task.prompt_field"
    assert err.reason == "row 0 has no field 'question' (fields: q, answer)"


def test_row_missing_the_field_names_its_row(tmp_path, datasets_cache) -> None:
    rows = word_rows(6)
    del rows[3]["question"]
    err = refused(spec_for(write_jsonl(tmp_path / "d.jsonl", rows)))
    assert str(err) == "task.prompt_field: row 3 has no field 'question'"


def test_row_missing_the_reference_names_its_row(tmp_path, datasets_cache) -> None:
    rows = word_rows(6)
    rows[4]["answer"] = None
    err = refused(spec_for(write_parquet(tmp_path / "d.parquet", rows), kind="parquet"))
    assert str(err) == "task.reference_field: row 4 has no field 'answer'"


def test_blank_prompt_names_its_row(tmp_path, datasets_cache) -> None:
    rows = word_rows(6)
    rows[2]["question"] = "   "
    err = refused(spec_for(write_jsonl(tmp_path / "d.jsonl", rows)))
    assert str(err) == "task.prompt_field: row 2 field 'question' is empty"


def test_prompt_column_that_is_not_text_is_refused(tmp_path, datasets_cache) -> None:
    rows = [{"question": i, "answer": "1"} for i in range(3)]
    err = refused(spec_for(write_jsonl(tmp_path / "d.jsonl", rows)))
    assert err.field == "task.prompt_field" and "not text" in err.reason


def test_unrenderable_messages_row_fails_the_submit(tmp_path, datasets_cache) -> None:
    rows = chat_rows(5)
    rows[3]["messages"] = [{"role": "bot", "content": "hi"}]
    err = refused(chat_spec(write_jsonl(tmp_path / "c.jsonl", rows)))
    assert err.field == "task.messages_field"
    assert err.reason.startswith("row 3 message 0 of 'messages' has role 'bot'")


def test_empty_messages_list_is_found_in_every_row(tmp_path, datasets_cache, monkeypatch) -> None:
    monkeypatch.setattr(check_module, "NUM_ROWS_RENDERED", 1)
    rows = chat_rows(5)
    rows[4]["messages"] = []
    err = refused(chat_spec(write_jsonl(tmp_path / "c.jsonl", rows)))
    assert str(err) == ("task.messages_field: row 4 field 'messages' is not a non-empty list "
                        "of messages")


def test_bad_row_past_the_rendered_ones_passes_and_is_skipped_when_served(
        tmp_path, datasets_cache, monkeypatch) -> None:
    monkeypatch.setattr(check_module, "NUM_ROWS_RENDERED", 2)
    rows = chat_rows(4)
    rows[3]["messages"] = [{"role": "user", "content": "hi"}, {"role": "assistant",
                                                              "content": "end"}]
    spec = chat_spec(write_jsonl(tmp_path / "c.jsonl", rows))
    check_job_dataset(spec)
    split = open_job_dataset(spec.task).train
    order = list(split.epoch_order(0))
    drawn = split.draw_renderable(order.index(3))
    assert drawn.skipped[0].row == 3 and drawn.row.prompt_id != "row-3"


def test_eval_path_errors_say_so(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(4))
    rows = word_rows(3)
    del rows[1]["question"]
    held = write_jsonl(tmp_path / "e.jsonl", rows)
    err = refused(spec_for(path, f'eval_path = "{held}"'))
    assert str(err) == "task.prompt_field: in task.eval_path, row 1 has no field 'question'"


def test_missing_eval_path_is_refused(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(4))
    err = refused(spec_for(path, f'eval_path = "{tmp_path / "nope.jsonl"}"'))
    assert err.field == "task.eval_path" and "does not exist" in err.reason


def _no_rows(path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": pa.array([], pa.string()),
                             "answer": pa.array([], pa.string())}), path)
    return path


def test_empty_eval_dataset_is_refused(tmp_path, datasets_cache) -> None:
    path = write_parquet(tmp_path / "d.parquet", word_rows(4))
    err = refused(spec_for(path, f'eval_path = "{_no_rows(tmp_path / "e.parquet")}"',
                           kind="parquet"))
    assert err.field == "task.eval_path" and "has no rows" in err.reason


def test_eval_fraction_that_leaves_too_few_training_rows_is_refused(
        tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(3))
    err = refused(spec_for(path, "eval_fraction = 0.5"))
    assert err.field == "task.eval_fraction" and "fewer than algorithm.prompts_per_step" in (
        err.reason)


def test_too_few_rows_for_a_step_is_refused(tmp_path, datasets_cache) -> None:
    err = refused(spec_for(write_jsonl(tmp_path / "d.jsonl", word_rows(1))))
    assert err.field == "task.path" and "1 training rows" in err.reason


def test_num_epochs_must_cover_the_jobs_steps(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(4))
    err = refused(spec_for(path, "num_epochs = 2"))  # 2 x 4 rows < 5 steps x 2 prompts
    assert err.field == "task.num_epochs" and "needs 10" in err.reason
    assert check_job_dataset(spec_for(path, "num_epochs = 3")).num_train_rows == 4
