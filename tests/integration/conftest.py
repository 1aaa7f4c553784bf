"""Fixtures for the integration tests.

``shared_stack``: one `libra up` stack (Redis + the five services, two rollout instances,
no restarts) for every module whose tests only submit jobs and read them back. A stack
start costs more CPU than most of those tests (six processes importing torch on two
cores), so they share one, each with its own job ids. Tests that restart processes or
need a stack configured otherwise start their own; tests that only kill a service or stop
the stack can end the shared one (``shared_stack_to_break`` below).

The modules using it run first (in their usual order; the other modules keep theirs), and
the stack is stopped after the last test using it: it is up for one stretch, never idle
beside another module's stack. In a parallel run (pytest-xdist, `make test`) those modules
are one group: they run on one worker, in that order, on one stack.

``shared_stack_for_module``: the same stack for a module whose tests share state that
outlives one test (a job started by a module fixture and watched by several tests); it
is checked once before the module and cleaned up after it, not around each test.

``shared_stack_to_break``: the same stack for tests that kill part of it or stop it
(restart_limit=0: what they kill stays dead). They run after every other test on it, in
their usual order, so nothing else ever sees what they broke; their module is split for
that (it must then have no module fixture of its own).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from libra_cli import stack
from tests.integration.stack_helpers import write_stack

HERE = Path(__file__).resolve().parent
SHARED = ("shared_stack", "shared_stack_for_module")
BREAKER = "shared_stack_to_break"
_LAST_USER = pytest.StashKey[str]()  # node id of the last test on the shared stack
# The pytest-xdist group of the modules on the shared stack (tests/xdist_groups.py: any
# other module is a group by itself).
SHARED_GROUP = "shared_stack"


def _breaks_shared(item: pytest.Item) -> bool:
    return BREAKER in getattr(item, "fixturenames", ())


def _uses_shared(item: pytest.Item) -> bool:
    return _breaks_shared(item) or any(
        name in getattr(item, "fixturenames", ()) for name in SHARED)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Within this directory's (contiguous) run of items: whole modules with a test on the
    shared stack first, then the tests that break it, then the rest, keeping the order of
    modules and of tests inside each."""
    ours = [i for i, item in enumerate(items) if HERE in Path(str(item.path)).parents]
    if not ours:
        return
    first, last = ours[0], ours[-1] + 1
    block = items[first:last]
    sharing = {item.path for item in block if _uses_shared(item)}
    block.sort(key=lambda item: (1 if _breaks_shared(item) else
                                 0 if item.path in sharing else 2))  # stable
    items[first:last] = block
    for item in block:  # parallel runs (`make test`): one worker, this order, one stack
        if item.path in sharing:
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUP))
    config.stash[_LAST_USER] = next(
        (item.nodeid for item in reversed(block) if _uses_shared(item)), "")


class _SharedStack:
    """Started on first use, stopped after its last user (or at the session's end)."""

    def __init__(self, run_root: Path) -> None:
        self.run_root = run_root
        self.state: dict[str, Any] | None = None

    def get(self) -> dict[str, Any]:
        if self.state is None:
            self.state = stack.up(self.run_root,
                                  write_stack(self.run_root / "stack.toml", restart_limit=0),
                                  timeout_s=120)
        return self.state

    def stop(self) -> None:
        if self.state is not None:
            self.state = None
            stack.down(self.run_root)


@pytest.fixture(scope="session")
def _shared_stack_owner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SharedStack]:
    owner = _SharedStack(tmp_path_factory.mktemp("shared-runs"))
    try:
        yield owner
    finally:
        owner.stop()  # a session that ended before the last user (-x, a selection)


def _checked(state: dict[str, Any]) -> dict[str, Any]:
    dead = [row["name"] for row in stack.status(state) if row["health"] != "SERVING"]
    # restart_limit=0: a service that died stays dead; say so rather than let this test
    # fail on a symptom (its log names the earlier test that killed it).
    assert not dead, (f"shared stack: {dead} not serving; see their logs under "
                      f"{state['run_root']}/.libra/logs")
    return state


async def _cancel_unfinished(state: dict[str, Any]) -> None:
    """Any job a test left unfinished (it failed mid-job) is cancelled, so the next
    test's job never queues behind it."""
    client = stack.coordinator_client(state)
    try:
        for job in await client.list_jobs():
            if not job.state.is_terminal:
                await client.cancel_job(job.job_id, "left unfinished by a test")
    finally:
        await client.close()


@pytest.fixture
async def shared_stack(_shared_stack_owner: _SharedStack,
                       request: pytest.FixtureRequest) -> AsyncIterator[dict]:
    """The shared stack, checked whole before the test; after it, any job the test left
    unfinished is cancelled."""
    state = _checked(_shared_stack_owner.get())
    yield state
    await _cancel_unfinished(state)
    if request.node.nodeid == request.config.stash.get(_LAST_USER, ""):
        _shared_stack_owner.stop()


@pytest.fixture(scope="module")
def shared_stack_for_module(_shared_stack_owner: _SharedStack,
                            request: pytest.FixtureRequest) -> Iterator[dict]:
    """The shared stack for a whole module, checked before its first test; after its last,
    any job left unfinished is cancelled (synchronous: a module fixture has no loop)."""
    state = _checked(_shared_stack_owner.get())
    yield state
    asyncio.run(_cancel_unfinished(state))
    last = request.config.stash.get(_LAST_USER, "")
    if last.split("::", 1)[0] == request.node.nodeid:
        _shared_stack_owner.stop()


@pytest.fixture
def shared_stack_to_break(_shared_stack_owner: _SharedStack,
                          request: pytest.FixtureRequest) -> Iterator[dict]:
    """The shared stack for a test that kills part of it or stops it; not checked whole
    (an earlier breaker may have killed a service), stopped after the last such test."""
    yield _shared_stack_owner.get()
    if request.node.nodeid == request.config.stash.get(_LAST_USER, ""):
        _shared_stack_owner.stop()
