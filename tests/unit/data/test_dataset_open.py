"""Opening a job's dataset: built-in tasks and files, splits, serving order
(libra/data/dataset.py). Real: the ``datasets`` library on small files in tmp."""

from __future__ import annotations

import random

import pytest

from libra.data import FILE_KINDS, DatasetSplit, RowError, open_job_dataset
from libra.data.builtin import BuiltinSource
from libra.data.order import legacy_order
from libra.errors import FailedPrecondition, InvalidArgument
from libra.jobspec import parse_job_spec
from libra.tasks import load_problems
from tests.fixtures.data_files import (
    chat_rows,
    word_rows,
    write_hf_dataset,
    write_jsonl,
    write_parquet,
)


def file_task(path, extra: str = "", kind: str = "jsonl"):
    return parse_job_spec(
        f'[task]\nkind = "{kind}"\npath = "{path}"\nprompt_field = "question"\n'
        f'reference_field = "answer"\nmetadata_field = "meta"\n{extra}\n'
        "[algorithm]\nsft_steps = 0\nprompts_per_step = 2\n").task


@pytest.mark.parametrize("name", ["arith", "calc-words"])
def test_builtin_rows_are_the_tasks_problems_in_their_order(name: str) -> None:
    task = parse_job_spec(f'[task]\nname = "{name}"\nseed = 3\nnum_prompts = 40\n').task
    split = open_job_dataset(task).train
    problems = load_problems(name, 3, 40)
    assert [split.row(i).prompt_id for i in range(40)] == [p.prompt_id for p in problems]
    assert [split.row(i).prompt_text for i in range(40)] == [p.prompt for p in problems]
    assert [split.row(i).reference for i in range(40)] == [str(p.answer) for p in problems]
    assert split.problems() == problems


def test_builtin_serving_order_is_the_legacy_epoch_shuffle() -> None:
    task = parse_job_spec('[task]\nseed = 5\nnum_prompts = 16\n').task
    split = open_job_dataset(task).train
    problems = load_problems("arith", 5, 16)
    # The scheduler's order before this module: one seeded sample per epoch, appended.
    expected = [i for epoch in range(3)
                for i in random.Random(5 * 1000 + epoch).sample(range(16), 16)]
    assert [split.draw(d).prompt_id for d in range(48)] == [
        problems[i].prompt_id for i in expected]


def test_kind_spelling_and_name_spelling_open_the_same_builtin() -> None:
    by_kind = open_job_dataset(parse_job_spec('[task]\nkind = "calc-words"\n').task)
    by_name = open_job_dataset(parse_job_spec('[task]\nname = "calc-words"\n').task)
    assert [by_kind.train.draw(d) for d in range(8)] == [by_name.train.draw(d) for d in range(8)]


def test_jsonl_rows_are_read_by_index(tmp_path, datasets_cache) -> None:
    dataset = open_job_dataset(file_task(write_jsonl(tmp_path / "d.jsonl", word_rows(10))))
    row = dataset.train.row(7)
    assert (row.prompt_id, row.prompt_text, row.reference) == ("row-7", "What is 7 + 8?", "15")
    assert len(dataset.train) == 10 and dataset.eval is None and dataset.kind == "jsonl"


def test_file_epochs_are_seeded_permutations(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(50))
    split = open_job_dataset(file_task(path)).train
    first, second = list(split.epoch_order(0)), list(split.epoch_order(1))
    assert sorted(first) == list(range(50)) and sorted(second) == list(range(50))
    assert first != second
    again = open_job_dataset(file_task(path)).train
    assert [again.draw(d) for d in range(100)] == [split.draw(d) for d in range(100)]


def test_shuffle_seed_defaults_to_seed_and_overrides_it(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(50))
    orders = {extra: list(open_job_dataset(file_task(path, extra)).train.epoch_order(0))
              for extra in ("seed = 4", "shuffle_seed = 4", "shuffle_seed = 5")}
    assert orders["seed = 4"] == orders["shuffle_seed = 4"] != orders["shuffle_seed = 5"]


def test_eval_fraction_holds_out_a_disjoint_seeded_share(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(100))
    dataset = open_job_dataset(file_task(path, "eval_fraction = 0.1"))
    train = {dataset.train.row(i).prompt_id for i in range(len(dataset.train))}
    held = {dataset.eval.row(i).prompt_id for i in range(len(dataset.eval))}
    assert (len(train), len(held), train & held) == (90, 10, set())
    again = open_job_dataset(file_task(path, "eval_fraction = 0.1"))
    assert {again.eval.row(i).prompt_id for i in range(10)} == held


def test_eval_path_serves_the_other_file(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(10))
    held = write_jsonl(tmp_path / "e.jsonl", word_rows(3, offset=100))
    dataset = open_job_dataset(file_task(path, f'eval_path = "{held}"'))
    assert [dataset.eval.row(i).prompt_id for i in range(3)] == ["eval-0", "eval-1", "eval-2"]
    assert dataset.eval.row(0).prompt_text == "What is 100 + 101?"
    assert len(dataset.train) == 10


def test_num_prompts_keeps_the_first_training_rows(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", word_rows(10))
    split = open_job_dataset(file_task(path, "num_prompts = 4")).train
    assert sorted(split.draw(d).prompt_id for d in range(4)) == [f"row-{i}" for i in range(4)]


def test_parquet_file_opens_like_jsonl(tmp_path, datasets_cache) -> None:
    path = write_parquet(tmp_path / "d.parquet", word_rows(6))
    split = open_job_dataset(file_task(path, kind="parquet")).train
    assert split.row(5).prompt_text == "What is 5 + 6?" and split.row(5).reference == "11"


def test_hf_dataset_folder_opens_the_named_split(tmp_path, datasets_cache) -> None:
    path = write_hf_dataset(tmp_path / "ds", {"train": word_rows(4), "test": word_rows(2)})
    assert len(open_job_dataset(file_task(path, kind="hf-dataset")).train) == 4
    test = open_job_dataset(file_task(path, 'split = "test"', kind="hf-dataset")).train
    assert len(test) == 2
    with pytest.raises(InvalidArgument) as err:
        open_job_dataset(file_task(path, 'split = "dev"', kind="hf-dataset"))
    assert err.value.field == "task.split" and "test, train" in err.value.reason


def test_single_dataset_folder_opens(tmp_path, datasets_cache) -> None:
    path = write_hf_dataset(tmp_path / "ds", {"": word_rows(3)})
    assert len(open_job_dataset(file_task(path, kind="hf-dataset")).train) == 3


def test_messages_rows_keep_their_messages(tmp_path, datasets_cache) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", chat_rows(3))
    task = parse_job_spec(
        f'[task]\nkind = "jsonl"\npath = "{path}"\nmessages_field = "messages"\n'
        'reference_field = "answer"\ndemonstration_field = "demo"\n'
        'tool_call_format = "hermes"\n[model]\nkind = "hf"\npath = "m"\n'
        "[algorithm]\nprompts_per_step = 2\n").task
    row = open_job_dataset(task).train.row(2)
    assert row.messages()[1] == {"role": "user", "content": "What is 2 * 3?"}
    assert row.demonstration()[-1]["role"] == "assistant"


class _Source:
    """Rows 1 and 2 cannot be rendered."""

    def __len__(self) -> int:
        return 4

    def row(self, index: int):
        if index in (1, 2):
            raise RowError("task.prompt_field", index, "has no field 'q'")
        return BuiltinSource(load_problems("arith", 0, 4)).row(index)


def test_draw_renderable_skips_bad_rows_and_reports_them() -> None:
    split = DatasetSplit(_Source(), None, lambda n, _s, _e: list(range(n)), 0)
    drawn = split.draw_renderable(1)
    assert (drawn.row.prompt_id, drawn.num_draws) == ("arith-0-3", 3)
    assert [e.row for e in drawn.skipped] == [1, 2]


def test_draw_renderable_refuses_a_dataset_with_nothing_to_render() -> None:
    split = DatasetSplit(_Source(), [1, 2], legacy_order, 0)
    with pytest.raises(FailedPrecondition, match="no row of the dataset can be rendered"):
        split.draw_renderable(0)


def test_file_kinds_are_registered() -> None:
    assert FILE_KINDS == ("jsonl", "parquet", "hf-dataset")
