"""The orphan sweep's page read with the tick's state (one round trip, not two), run
against both scheduler stores: the in-memory one and Redis (the tick's Lua script
HSCANs the assignments) on the session's real redis-server.
"""

from __future__ import annotations

from tests.store import test_scheduler_store_contract as contract
from tests.store.test_scheduler_store_contract import JOB, World, placed

world = contract.world  # the fixture: both stores


async def test_a_tick_asked_for_a_page_reads_it_as_assignments_page_would(
        world: World) -> None:
    await world.job()
    await placed(world, *(f"t{i:02d}" for i in range(30)), instance="ro-0")
    assert (await world.store.tick_state(JOB, ">", 1)).orphan_page is None  # not asked
    swept: dict[str, str] = {}
    cursor, pages = 0, 0
    while True:  # a whole sweep, page by page, through the tick's read
        state = await world.store.tick_state(JOB, ">", 1, orphan_page=(cursor, 7))
        assert state.orphan_page is not None
        cursor, page = state.orphan_page
        swept.update(page)
        pages += 1
        if cursor == 0 or pages > 100:
            break
    assert swept == await world.store.assignments(JOB)
    assert len(swept) == 30 and set(swept.values()) == {"ro-0"}
