"""A failed lease renewal is tried again soon, not a whole period later
(``libra/lease_timing.py``): a coordinator that comes back while the lease still lives
must find it renewed in time. The fake coordinator expires leases by the loop's clock,
as Redis does; the rig's lease asks 6 s (renewals every 2 s)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from libra.lease_timing import RETRY_FIRST_S, renewal_wait_s
from tests.unit.rollout.rig import Rig, started_rig
from tests.waiting import wait_until


@pytest.fixture
async def six_second_rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with started_rig(tmp_path, lease_ttl_ms=6_000) as rig:
        yield rig


async def test_two_failed_renewals_in_a_row_do_not_cost_the_lease(six_second_rig: Rig) -> None:
    rig = six_second_rig
    rig.coordinator.expire_leases = True
    await rig.core.register()  # granted anew: expires 6 s from now unless renewed
    acquired = len(rig.coordinator.acquired)
    # The coordinator restarts over the first two renewals (2 s, then 2.25 s). Waiting
    # a period after each, as before, the third came at 6 s: the lease was gone.
    rig.coordinator.renew_unavailable_times = 2
    rig.start()
    await wait_until(lambda: len(rig.coordinator.renewed) >= 3)
    assert rig.coordinator.num_expired == 0
    assert len(rig.coordinator.acquired) == acquired  # not registered again


def test_renewals_come_every_third_of_the_ttl() -> None:
    assert renewal_wait_s(12_000, 0) == pytest.approx(4.0)
    # Counted from the last attempt's start: a slow answer does not push the next back.
    assert renewal_wait_s(12_000, 0, elapsed_s=1.5) == pytest.approx(2.5)
    assert renewal_wait_s(12_000, 0, elapsed_s=9.0) == 0.0


def test_failed_renewals_are_retried_soon_within_a_sixth_of_the_ttl() -> None:
    waits = [renewal_wait_s(12_000, n) for n in range(1, 6)]
    assert waits == pytest.approx([RETRY_FIRST_S, 0.5, 1.0, 2.0, 2.0])
    assert renewal_wait_s(600, 1) == pytest.approx(0.1)  # a sixth of a short TTL
    assert renewal_wait_s(12_000, 10_000) == pytest.approx(2.0)  # no overflow
