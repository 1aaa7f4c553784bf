"""CausalPrefixTree: statistics, P90 window, lookups, rebuild, snapshots."""

import json

import pytest

from scheduling.policy import CausalPrefixTree, RecentTrajectory
from scheduling.policy.prefix_tree import quantile

A, B, C = "search:small:success", "search:large:failure", "code:small:timeout"


def make_tree(window_samples: int = 200) -> CausalPrefixTree:
    tree = CausalPrefixTree(window_samples)
    tree.insert("p1", [A, B], [900, 400], 1_000)
    tree.insert("p1", [A, C], [700, 100], 800)
    tree.insert("p2", [B], [5_000], 5_100)
    return tree


def test_prompt_root_holds_total_length_and_children_remaining_length() -> None:
    tree = make_tree()
    root = tree.lookup("p1", [])
    node = tree.lookup("p1", [A])
    assert root is not None and node is not None
    assert (root.visit_count, root.mean_tokens) == (2, 900.0)
    assert (node.visit_count, node.mean_tokens, node.depth) == (2, 800.0, 1)


def test_global_root_aggregates_all_prompts() -> None:
    tree = make_tree()
    assert tree.global_root.visit_count == 3
    node = tree.lookup(None, [B])
    assert node is not None and node.mean_tokens == 5_000


def test_p90_uses_linear_interpolation() -> None:
    assert quantile([float(v) for v in range(1, 11)], 0.9) == pytest.approx(9.1)


def test_window_is_bounded_and_p90_cache_invalidated_on_insert() -> None:
    tree = CausalPrefixTree(window_samples=2)
    for remaining in (10_000, 100, 200):
        tree.insert("p", [A], [remaining], remaining)
    node = tree.lookup("p", [A])
    assert node is not None
    assert node.samples == (100, 200)
    assert node.p90_tokens == pytest.approx(190.0)
    tree.insert("p", [A], [300], 300)
    assert node.p90_tokens == pytest.approx(290.0)


def test_running_mean_covers_all_visits_not_only_window() -> None:
    tree = CausalPrefixTree(window_samples=1)
    tree.insert("p", [A], [100], 100)
    tree.insert("p", [A], [300], 300)
    node = tree.lookup("p", [A])
    assert node is not None and node.mean_tokens == 200.0


def test_exact_lookup_returns_none_on_mismatch() -> None:
    assert make_tree().lookup("p1", [A, A]) is None


def test_lookup_with_fallback_returns_deepest_matching_node() -> None:
    node = make_tree().lookup_with_fallback("p1", [A, A, B])
    assert (node.depth, node.key) == (1, A)


def test_lookup_with_fallback_uses_global_root_for_unseen_prompt() -> None:
    tree = make_tree()
    node = tree.lookup_with_fallback("never-seen", [B])
    assert node is tree.lookup(None, [B])


def test_lookup_on_empty_tree_returns_global_root_with_no_visits() -> None:
    assert CausalPrefixTree().lookup_with_fallback("p", [A]).visit_count == 0


def test_insert_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="one entry per path key"):
        CausalPrefixTree().insert("p", [A, B], [1], 1)


def test_rebuild_forgets_everything_not_in_recent() -> None:
    tree = make_tree()
    tree.rebuild([RecentTrajectory("p9", (C,), (50,), 60)])
    assert not tree.has_prompt("p1")
    assert tree.stats().num_insertions == 1
    assert tree.global_root.mean_tokens == 60


def test_snapshot_round_trip_is_exact_through_json() -> None:
    tree = make_tree(window_samples=3)
    restored = CausalPrefixTree.from_dict(json.loads(json.dumps(tree.to_dict())))
    assert restored.to_dict() == tree.to_dict()
    node, restored_node = tree.lookup("p1", [A]), restored.lookup("p1", [A])
    assert node is not None and restored_node is not None
    assert (restored_node.mean_tokens, restored_node.p90_tokens) == (
        node.mean_tokens,
        node.p90_tokens,
    )


def test_snapshot_with_unknown_version_raises() -> None:
    with pytest.raises(ValueError, match="version"):
        CausalPrefixTree.from_dict({"version": 99})


def test_size_stats_count_roots_and_nodes() -> None:
    stats = make_tree().stats()
    # global: root, A, A/B, A/C, B = 5; p1: root, A, A/B, A/C = 4; p2: root, B = 2.
    assert (stats.num_prompts, stats.num_nodes, stats.max_depth, stats.num_insertions) == (
        2,
        11,
        2,
        3,
    )


def test_recent_trajectory_round_trip() -> None:
    recent = RecentTrajectory("p", (A, B), (10, 5), 20)
    assert RecentTrajectory.from_dict(json.loads(json.dumps(recent.to_dict()))) == recent
