"""Arrows inside the foundation and a service that the four import contracts do not name.

The dataset registry and the task spec must not import each other (the spec validates
``task.kind`` against the registry; the registry's openers take ``SourceOptions``, built
from the spec in ``libra.data.dataset``), and the rollout's in-memory store must not
import its Redis store (the rule both share lives in ``store_protocol.py``).
Type-checking imports count, as in ``test_import_contracts.py``. Real: the import graph
of the checked-out tree (grimp, the library under import-linter).
"""

from __future__ import annotations

import grimp
import pytest


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("libra", "services", exclude_type_checking_imports=False,
                             cache_dir=None)


def test_the_dataset_registry_does_not_import_the_task_spec(graph: grimp.ImportGraph) -> None:
    assert graph.find_shortest_chain("libra.taskspec", "libra.data.registry") is not None
    assert graph.find_shortest_chain("libra.data.registry", "libra.taskspec") is None


def test_the_in_memory_rollout_store_does_not_import_the_redis_store(
        graph: grimp.ImportGraph) -> None:
    chain = graph.find_shortest_chain("services.rollout.memory_store", "services.rollout.store")
    assert chain is None, chain
    assert graph.find_shortest_chain("services.rollout.store",
                                     "services.rollout.store_protocol") is not None
