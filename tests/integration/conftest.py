"""Fixtures for the integration tests.

``shared_stack``: one `libra up` stack (Redis + the five services, two rollout instances,
no restarts) for every module whose tests only submit jobs and read them back. A stack
start costs more CPU than most of those tests (six processes importing torch on two
cores), so they share one, each with its own job ids. Tests that kill, restart or stop
processes, or need a stack configured otherwise, start their own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from libra_cli import stack
from tests.integration.stack_helpers import stack_up


@pytest.fixture(scope="package")
def _shared_stack_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from stack_up(tmp_path_factory.mktemp("shared-runs"), restart_limit=0)


@pytest.fixture
async def shared_stack(_shared_stack_state: dict) -> AsyncIterator[dict]:
    """The shared stack, checked whole before the test; after it, any job the test left
    unfinished (it failed mid-job) is cancelled, so the next test's job never queues
    behind it."""
    dead = [row["name"] for row in stack.status(_shared_stack_state)
            if row["health"] != "SERVING"]
    # restart_limit=0: a service that died stays dead; say so rather than let this test
    # fail on a symptom (its log names the earlier test that killed it).
    assert not dead, f"shared stack: {dead} not serving; see their logs under " \
                     f"{_shared_stack_state['run_root']}/.libra/logs"
    yield _shared_stack_state
    client = stack.coordinator_client(_shared_stack_state)
    try:
        for job in await client.list_jobs():
            if not job.state.is_terminal:
                await client.cancel_job(job.job_id, "left unfinished by a test")
    finally:
        await client.close()
