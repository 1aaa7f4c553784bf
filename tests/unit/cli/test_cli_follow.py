"""`libra run` keeps following its job through a coordinator that is briefly busy or
restarting (a retryable error), and gives up on one that stays gone or refuses."""

from __future__ import annotations

import json

import pytest

from libra import types as t
from libra.errors import DeadlineExceeded, NotFound
from libra_cli import run as cli


def job(state: t.JobState, step: int = 0) -> t.Job:
    spec = json.dumps({"algorithm": {"num_steps": 2}})
    return t.Job(job_id=t.JobId("j"), name="j", state=state, spec_json=spec,
                 created_at_ms=0, updated_at_ms=0, step=step)


class FlakyCoordinator:
    """GetJob fails with the given errors first, then reports the job done."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def get_job(self, _job_id: str):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return job(t.JobState.SUCCEEDED, step=2), [{"reward_mean": 1.0}], {"trained": 4}


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_s: float) -> None:
        return None

    monkeypatch.setattr(cli.asyncio, "sleep", instant)


async def test_retryable_errors_while_following_are_ridden_out() -> None:
    client = FlakyCoordinator(DeadlineExceeded("busy"), DeadlineExceeded("busy"))
    done = await cli.follow(client, job(t.JobState.RUNNING), quiet=True)
    assert done.state is t.JobState.SUCCEEDED and client.calls == 3


async def test_a_non_retryable_error_ends_the_follow() -> None:
    with pytest.raises(NotFound):
        await cli.follow(FlakyCoordinator(NotFound("gone")), job(t.JobState.RUNNING), True)


async def test_an_outage_longer_than_the_limit_ends_the_follow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "FOLLOW_OUTAGE_S", -1.0)
    with pytest.raises(DeadlineExceeded):
        await cli.follow(FlakyCoordinator(DeadlineExceeded("down"), DeadlineExceeded("down")),
                          job(t.JobState.RUNNING), True)
