"""CoordinatorCore + the init_from check: a job whose ``algorithm.init_from`` names a
missing or incompatible checkpoint is refused (InvalidArgument naming the field) and
nothing is stored or started; a fitting one creates the job.

Real: ``services.coordinator.init_from_check`` over checkpoints written by the trainer's
own code, the spec parser, ``InMemoryCoordinatorStore``. Fakes: ``FakeRunner``,
``FakeClock``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from libra.clock import FakeClock
from services.coordinator.core import CoordinatorCore
from services.coordinator.init_from_check import check_job_init_from
from services.coordinator.memory_store import InMemoryCoordinatorStore
from tests.fakes.runner import FakeRunner
from tests.fixtures.checkpoints import SMALL, tiny_spec, write_job_checkpoint
from tests.unit.coordinator.checked_core import Built, refused


@pytest.fixture(scope="module")
def source_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "src-job"
    write_job_checkpoint(run_dir, tiny_spec())
    return run_dir


def spec_text(init_from: str, hidden_size: int = SMALL["hidden_size"]) -> str:
    model = "\n".join(f"{k} = {v}" for k, v in {**SMALL, "hidden_size": hidden_size}.items())
    return f'name = "warm"\n[model]\n{model}\n[algorithm]\ninit_from = "{init_from}"\n'


async def test_an_incompatible_checkpoint_is_refused_and_nothing_is_created(
        source_run_dir: Path) -> None:
    err = await refused(Built(init_from_check=check_job_init_from),
                        spec_text(str(source_run_dir), hidden_size=64))
    assert err.field == "algorithm.init_from" and "model.embed_tokens.weight" in err.reason


async def test_a_missing_checkpoint_is_refused(tmp_path: Path) -> None:
    err = await refused(Built(init_from_check=check_job_init_from),
                        spec_text(str(tmp_path / "gone")))
    assert err.field == "algorithm.init_from"


async def test_a_job_id_under_the_run_root_creates_the_job(source_run_dir: Path) -> None:
    clock = FakeClock()
    store, trainer = InMemoryCoordinatorStore(clock), FakeRunner()
    core = CoordinatorCore(store, trainer, FakeRunner(), clock, source_run_dir.parent,
                           init_from_check=check_job_init_from)
    job = await core.create_job(spec_text("src-job"), "toml")
    assert trainer.started == [job.job_id]
    assert '"init_from": "src-job"' in job.spec_json and '"sft_steps": 0' in job.spec_json
