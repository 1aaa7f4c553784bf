"""Sandbox uids are exclusive host-wide: two pools on one lock dir never share a uid."""

from __future__ import annotations

import pytest

from services.toolgateway.isolation import UidPool


def test_two_pools_never_hand_out_the_same_uid(tmp_path):
    a, b = UidPool(5000, 3, str(tmp_path)), UidPool(5000, 3, str(tmp_path))
    held_a = [a.acquire(), a.acquire()]
    held_b = b.acquire()
    assert held_a == [5000, 5001] and held_b == 5002
    with pytest.raises(RuntimeError, match="exhausted"):
        b.acquire()
    a.release(5000)
    assert b.acquire() == 5000  # released uids become free host-wide
