"""The rollout loop's own timing (services/rollout/profile.py): passes split into
phases, the tasks' operations, bounded buffers, and its report through the core."""

from __future__ import annotations

import asyncio
import json

import pytest

from services.rollout.profile import LoopProfile
from tests.fakes.toolgateway import tool_result
from tests.unit.rollout.rig import Rig, make_task
from tests.waiting import wait_until


class _Engine:
    policy_version = 3

    def generate(self, requests: list) -> list:
        return [f"r{r}" for r in requests]


async def test_a_pass_with_an_engine_call_records_every_phase() -> None:
    profile = LoopProfile()
    profile.start_pass(active=2)
    profile.mark("pull")
    profile.mark("refresh")
    assert await profile.engine_call(_Engine(), [1, 2]) == ["r1", "r2"]
    profile.end_pass()
    (p,) = profile.to_dict()["passes"]
    assert (p["active"], p["batch"], p["version"]) == (2, 2, 3)
    for phase in ("pull_s", "refresh_s", "prep_s", "dispatch_s", "engine_s", "resume_s",
                  "after_s"):
        assert p[phase] >= 0.0, phase


async def test_passes_without_an_engine_call_are_only_counted() -> None:
    profile = LoopProfile()
    for _ in range(3):
        profile.start_pass(active=1)
        profile.mark("pull")
        profile.end_pass()
    profile.start_pass(active=1)
    assert profile.to_dict()["passes"] == [] and profile.idle_passes == 3


async def test_timed_records_an_operation_also_when_it_raises() -> None:
    profile = LoopProfile()

    async def boom() -> None:
        raise RuntimeError("down")

    assert await profile.timed("score", asyncio.sleep(0, "ok"), "tr-1") == "ok"
    with pytest.raises(RuntimeError):
        await profile.timed("tool", boom(), "tr-2")
    ops = profile.to_dict()["ops"]
    assert [(o["op"], o["key"]) for o in ops] == [("score", "tr-1"), ("tool", "tr-2")]


async def test_task_start_lag_is_recorded_when_the_task_first_runs() -> None:
    profile = LoopProfile()
    assert await asyncio.create_task(profile.task(asyncio.sleep(0, 7))) == 7
    (op,) = profile.to_dict()["ops"]
    assert op["op"] == "task_start" and op["wall_s"] >= 0.0


async def test_buffers_are_bounded() -> None:
    profile = LoopProfile(maxlen=2)
    for _ in range(5):
        await profile.timed("publish", asyncio.sleep(0))
    assert len(profile.to_dict()["ops"]) == 4


async def test_the_core_times_its_passes_and_its_tasks_operations(rig: Rig) -> None:
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    rig.tools.results.append(tool_result("3"))
    await rig.place(make_task())
    await rig.run_until_published()
    profile = json.loads(rig.core.profile.to_json())
    await wait_until(lambda: any(o["op"] == "report" for o in rig.core.profile.to_dict()["ops"]))
    assert len(profile["passes"]) == 2 and profile["passes"][0]["batch"] == 1
    ops = {o["op"] for o in profile["ops"]}
    assert {"tool", "score", "publish", "task_start"} <= ops
    assert {o["key"] for o in profile["ops"] if o["op"] == "tool"} == {"tr-0"}
