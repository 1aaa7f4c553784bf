"""CoordinatorCore + the model check: a job whose model cannot be trained here is refused
with InvalidArgument naming the field, and nothing is stored or started.

Real: ``services.coordinator.model_check.check_job_model`` (transformers on the tiny
fixture models), the job spec parser, ``InMemoryCoordinatorStore``. Fakes: ``FakeRunner``
for the trainer and scheduler clients, ``FakeClock``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from libra.errors import InvalidArgument
from libra.jobspec import JobSpec
from services.coordinator.model_check import check_job_model
from tests.unit.coordinator.checked_core import Built, refused


def hf_spec(path: Path | str, extra: str = "") -> str:
    return (f'name = "hf"\n[model]\nkind = "hf"\npath = {json.dumps(str(path))}\n{extra}'
            '[algorithm]\nnum_steps = 2\n')




async def test_missing_model_dir_is_refused_and_nothing_is_created(tmp_path):
    err = await refused(Built(model_check=check_job_model), hf_spec(tmp_path / "missing"))
    assert err.field == "model.path" and "does not exist" in err.reason


async def test_dir_without_tokenizer_is_refused(hf_model_dir, tmp_path):
    folder = Path(shutil.copytree(hf_model_dir("llama"), tmp_path / "m"))
    (folder / "tokenizer.json").unlink()
    err = await refused(Built(model_check=check_job_model), hf_spec(folder))
    assert "has no tokenizer files" in err.reason


async def test_hermes_with_a_template_that_ignores_tools_is_refused(hf_model_dir):
    spec = hf_spec(hf_model_dir("llama"), 'tool_template = "model"\n[task]\n'
                   'tool_call_format = "hermes"\n')
    err = await refused(Built(model_check=check_job_model), spec)
    assert err.field == "model.tool_template"


async def test_a_good_hf_model_creates_the_job(hf_model_dir):
    built = Built(model_check=check_job_model)
    job = await built.core.create_job(hf_spec(hf_model_dir("qwen3")), "toml")
    assert [j.job_id for j in await built.store.list_jobs()] == [job.job_id]
    assert built.trainer.started == [job.job_id]


async def test_the_check_sees_the_parsed_spec_after_schema_validation():
    seen: list[JobSpec] = []
    built = Built(model_check=seen.append)
    await built.core.create_job('name = "tiny"\n[algorithm]\nnum_steps = 2\n', "toml")
    assert [s.name for s in seen] == ["tiny"]
    with pytest.raises(InvalidArgument):
        await built.core.create_job("[algorithm]\nclip_eps = 2.0\n", "toml")
    assert len(seen) == 1  # a spec failing the schema never reaches the model check


async def test_the_built_in_model_needs_no_model_directory():
    built = Built(model_check=check_job_model)
    job = await built.core.create_job('name = "tiny"\n', "toml")
    assert built.trainer.started == [job.job_id]
