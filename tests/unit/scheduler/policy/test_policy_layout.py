"""BucketLayout: validation, length mapping, fallback order, lookup errors."""

import pytest
from policy_builders import make_layout

from libra.types import Bucket
from scheduling.policy import BucketLayout, UnknownBucket


def test_empty_layout_raises_naming_buckets() -> None:
    with pytest.raises(ValueError, match="buckets"):
        BucketLayout([])


def test_duplicate_names_raise_naming_name_field() -> None:
    with pytest.raises(ValueError, match=r"buckets\.name"):
        BucketLayout([Bucket("a", 10), Bucket("a", 20)])


def test_thresholds_out_of_order_raise_naming_max_tokens() -> None:
    with pytest.raises(ValueError, match=r"buckets\.max_tokens.*strictly increasing"):
        BucketLayout([Bucket("a", 20), Bucket("b", 10)])


def test_non_positive_cap_raises_naming_field() -> None:
    with pytest.raises(ValueError, match="max_trajectories_per_instance"):
        BucketLayout([Bucket("a", 10, max_trajectories_per_instance=0)])


def test_bucket_for_length_picks_first_bucket_covering_length() -> None:
    layout = make_layout()
    assert [layout.bucket_for_length(n).name for n in (0, 1_000, 1_001, 5_000, 20_000)] == [
        "short",
        "short",
        "medium",
        "medium",
        "long",
    ]


def test_bucket_for_length_beyond_largest_returns_largest() -> None:
    assert make_layout().bucket_for_length(10**9).name == "long"


def test_fallback_order_is_nearest_first_ties_toward_longer() -> None:
    layout = make_layout()
    assert layout.fallback_order("short") == ("medium", "long")
    assert layout.fallback_order("medium") == ("long", "short")
    assert layout.fallback_order("long") == ("medium", "short")


def test_unknown_bucket_name_raises_unknown_bucket_listing_names() -> None:
    with pytest.raises(UnknownBucket, match="unknown bucket 'huge'.*short"):
        make_layout().get("huge")


def test_unknown_bucket_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        make_layout().index("huge")


def test_ordering_helpers() -> None:
    layout = make_layout()
    assert (layout.shortest.name, layout.longest.name, layout.names) == (
        "short",
        "long",
        ("short", "medium", "long"),
    )
    assert "medium" in layout and "huge" not in layout and len(layout) == 3


def test_fallback_walk_matches_nearest_first_order_and_is_lazy() -> None:
    # The walk replaced a precomputed table of every bucket's order (B^2 names).
    buckets = [Bucket(f"b{i}", 16 * (i + 1), 1, 8, 8) for i in range(7)]
    layout = BucketLayout(buckets)
    for home, bucket in enumerate(buckets):
        others = sorted((i for i in range(7) if i != home), key=lambda i: (abs(i - home), -i))
        assert layout.fallback_order(bucket.name) == tuple(f"b{i}" for i in others)
    big = BucketLayout([Bucket(f"b{i}", i + 1, 1, 8, 8) for i in range(10_000)])
    walk = big.iter_fallback("b5000")
    assert [next(walk) for _ in range(3)] == ["b5001", "b4999", "b5002"]
    with pytest.raises(UnknownBucket):
        big.iter_fallback("nope")
