"""CoordinatorCore + the dataset check: a job whose dataset cannot feed it is refused
with InvalidArgument naming the field (and row), and nothing is stored or started.

Real: ``services.coordinator.dataset_check.check_dataset`` (the ``datasets`` library on
files in tmp), the job spec parser, ``InMemoryCoordinatorStore``. Fakes: ``FakeRunner``
for the trainer and scheduler clients, ``FakeClock``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libra.errors import InvalidArgument
from libra.jobspec import JobSpec
from services.coordinator.dataset_check import check_dataset
from tests.fixtures.data_files import word_rows, write_jsonl
from tests.unit.coordinator.checked_core import Built, refused


def jsonl_spec(path: Path | str, extra: str = "") -> str:
    return (f'name = "data"\n[task]\nkind = "jsonl"\npath = "{path}"\n'
            f'prompt_field = "question"\nreference_field = "answer"\n{extra}'
            "[algorithm]\nnum_steps = 2\nsft_steps = 0\nprompts_per_step = 2\n")




async def test_missing_dataset_is_refused_and_nothing_is_created(tmp_path, datasets_cache):
    err = await refused(Built(dataset_check=check_dataset), jsonl_spec(tmp_path / "missing.jsonl"))
    assert err.field == "task.path" and "does not exist" in err.reason


async def test_row_without_the_mapped_field_is_refused_naming_the_row(tmp_path, datasets_cache):
    rows = word_rows(8)
    del rows[3]["question"]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    err = await refused(Built(dataset_check=check_dataset), jsonl_spec(path))
    assert str(err) == "task.prompt_field: row 3 has no field 'question'"


async def test_a_good_dataset_creates_the_job(tmp_path, datasets_cache):
    built = Built(dataset_check=check_dataset)
    job = await built.core.create_job(
        jsonl_spec(write_jsonl(tmp_path / "d.jsonl", word_rows(8)), "eval_fraction = 0.25\n"),
        "toml")
    assert [j.job_id for j in await built.store.list_jobs()] == [job.job_id]
    assert built.trainer.started == [job.job_id] and built.scheduler.started == [job.job_id]


async def test_the_check_sees_the_parsed_spec_after_schema_validation():
    seen: list[JobSpec] = []
    built = Built(dataset_check=seen.append)
    await built.core.create_job('name = "tiny"\n[algorithm]\nnum_steps = 2\n', "toml")
    assert [s.task.resolved_kind for s in seen] == ["arith"]
    with pytest.raises(InvalidArgument):
        await built.core.create_job('[task]\nkind = "jsonl"\n', "toml")
    assert len(seen) == 1


async def test_builtin_task_passes_the_real_check():
    built = Built(dataset_check=check_dataset)
    await built.core.create_job('[task]\nkind = "calc-words"\n[algorithm]\nnum_steps = 2\n',
                                "toml")
    assert len(await built.store.list_jobs()) == 1
