"""make_policy and the in-memory store."""

import pytest
from policy_builders import FAIL, make_layout, teach

from scheduling.policy import (
    POLICY_NAMES,
    CmlfqConfig,
    CmlfqPolicy,
    InMemoryPolicyStore,
    LengthAwareConfig,
    make_policy,
)


def test_every_registered_name_builds_a_policy_with_that_name() -> None:
    names = [make_policy(name, make_layout()).name for name in POLICY_NAMES]
    assert names == ["cmlfq", "least_loaded", "length_aware", "la_mlfq", "toolcount"]


def test_unknown_policy_name_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown policy 'fifo'.*cmlfq, least_loaded"):
        make_policy("fifo", make_layout())


def test_wrong_config_type_raises() -> None:
    with pytest.raises(TypeError, match="CmlfqConfig"):
        make_policy("cmlfq", make_layout(), LengthAwareConfig())


def test_make_cmlfq_restores_tree_from_store() -> None:
    store = InMemoryPolicyStore(copy_values=True)
    first = CmlfqPolicy(make_layout(100), store, CmlfqConfig())
    teach(first, "p1", FAIL, 15_000)
    first.on_step_end(1)
    second = make_policy("cmlfq", make_layout(100), store=store)
    assert second.stats()["tree_insertions"] == 3


def test_store_copy_values_isolates_callers() -> None:
    store = InMemoryPolicyStore(copy_values=True)
    value = {"path_keys": ["a"]}
    store.put_trajectory("t", value)
    value["path_keys"].append("b")
    assert store.get_trajectory("t") == {"path_keys": ["a"]}


def test_store_recent_ring_keeps_newest() -> None:
    store = InMemoryPolicyStore()
    for i in range(5):
        store.append_recent({"i": i}, max_len=3)
    assert store.recent() == [{"i": 2}, {"i": 3}, {"i": 4}]
