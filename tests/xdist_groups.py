"""Parallel test runs (`make test`: pytest-xdist ``-n N --dist loadgroup``, one worker per
CPU): which tests must share a worker, and a scheduler that keeps them together.

Each test module runs whole on one worker, in its order (as ``--dist loadfile``): a
module fixture (a started stack, a built model) is built once, not once per worker. A
module in an ``xdist_group`` runs on one worker with the rest of its group, in collection
order: tests/integration/conftest.py puts the modules on its shared stack in one group,
so that they share one stack and the tests that break it run after every other user.

pytest-xdist's own ``loadgroup`` reads the marks through node ids that its worker tags
with ``@group`` by setting ``item._nodeid``; pytest 9 keeps node ids elsewhere
(``item._id``), so with pytest-xdist 3.8.0 the tag is lost and the marks are ignored. Here
each worker writes the group of every test it collected to a file instead (the controller
does not collect), and the scheduler reads it when it distributes the tests, which is
after every worker's collection has finished.

Groups go out in collection order (not largest first, xdist's default): the integration
modules, the longest, are collected before service, store and unit modules, and the many
short modules at the end fill the gaps when one worker finishes early.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

GROUPS_DIR_KEY = "libra_xdist_groups_dir"
_DIR = pytest.StashKey[str]()  # the controller's groups folder


def group_of(item: pytest.Item) -> str:
    """The item's ``xdist_group`` name, or its module's path when it has none."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or item.nodeid.split("::", 1)[0]


# The hooks: tests/conftest.py imports them (so does the test of this module's own conftest).


def pytest_configure(config: pytest.Config) -> None:
    if _is_grouping_controller(config):
        path = tempfile.mkdtemp(prefix="libra-xdist-groups-")  # where workers leave groups
        config.stash[_DIR] = path
        config.add_cleanup(lambda: shutil.rmtree(path, ignore_errors=True))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist's WorkerController
    if _DIR in node.config.stash:
        node.workerinput[GROUPS_DIR_KEY] = node.config.stash[_DIR]


@pytest.hookimpl(trylast=True)  # after every hook that sets groups (tests/integration)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker of a grouping run: every collected test's group, to the controller's
    folder (written whole, then renamed into place: the scheduler never reads half)."""
    workerinput = getattr(config, "workerinput", {})
    if GROUPS_DIR_KEY not in workerinput:
        return
    out = Path(workerinput[GROUPS_DIR_KEY]) / f"{workerinput['workerid']}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({item.nodeid: group_of(item) for item in items}))
    os.replace(tmp, out)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: whole modules and ``xdist_group`` groups per worker."""
    if not _is_grouping_controller(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """``LoadScopeScheduling`` whose scope of a test is its group (``group_of``)."""

        def __init__(self) -> None:
            super().__init__(config, log)
            self._groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first called once every collection has finished
                files = sorted(Path(config.stash[_DIR]).glob("*.json"))
                assert files, "no worker wrote its test groups"
                self._groups = json.loads(files[0].read_text())
            return self._groups[nodeid]

    config.option.loadscopereorder = False  # collection order (see the docstring)
    return GroupScheduling()


def _is_grouping_controller(config: pytest.Config) -> bool:
    """This process distributes tests over workers with ``--dist loadgroup``."""
    return (not hasattr(config, "workerinput")
            and getattr(config.option, "dist", "no") == "loadgroup")
