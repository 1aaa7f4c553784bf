"""libra/gc_policy.py: the scheduler's and coordinator's collector policy, applied in
this process and put back afterwards."""

from __future__ import annotations

import gc

from libra.gc_policy import FULL_EVERY_YOUNG, tune_for_latency


def test_start_up_objects_are_frozen_and_full_collections_are_rare() -> None:
    threshold = gc.get_threshold()
    try:
        kept = object.__new__(type("Kept", (), {}))  # tracked, alive at start-up
        tune_for_latency()
        assert gc.get_freeze_count() > 0 and gc.is_tracked(kept)
        young, middle, full = gc.get_threshold()
        assert (young, middle) == threshold[:2]  # the young generations as they were
        assert full == FULL_EVERY_YOUNG > threshold[2]
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
