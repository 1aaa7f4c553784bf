"""CoordinatorCore + the tool catalog: at submit the enabled tools are checked against
the gateway's ListTools and their schemas frozen into the stored spec, and the rewards
(a composite's components too) against its ListRewards; an unknown tool or reward or
(for a chat job) an unreachable gateway creates nothing.

Real: the job spec parser, ``InMemoryCoordinatorStore``. Fakes: the catalog (the tool
gateway client's ``list_tools``), the runners, ``FakeClock``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra.clock import FakeClock
from libra.errors import InvalidArgument, Unavailable
from libra.jobspec import job_spec_from_json
from services.coordinator.core import CoordinatorCore
from services.coordinator.memory_store import InMemoryCoordinatorStore
from tests.fakes.runner import FakeRunner

CATALOG = [
    {"name": "calculator", "description": "Evaluate arithmetic.", "idempotent": True,
     "args_schema": {"type": "object", "properties": {"expression": {"type": "string"}}}},
    {"name": "search", "description": "BM25 search.", "idempotent": True,
     "args_schema": {"type": "object", "properties": {"query": {"type": "string"}}}},
]


REWARDS = [{"name": "exact_match", "description": "x"}, {"name": "format", "description": "y"},
           {"name": "composite", "description": "z"}, {"name": "my_verifier", "description": ""}]


class FakeCatalog:
    def __init__(self, tools: list[dict] | None = None, down: bool = False) -> None:
        self.tools = tools if tools is not None else CATALOG
        self.down = down

    async def list_tools(self) -> list[dict]:
        if self.down:
            raise Unavailable("tool gateway down")
        return self.tools

    async def list_rewards(self) -> list[dict]:
        if self.down:
            raise Unavailable("tool gateway down")
        return REWARDS


def build(catalog: FakeCatalog) -> tuple[CoordinatorCore, InMemoryCoordinatorStore]:
    clock = FakeClock()
    store = InMemoryCoordinatorStore(clock)
    core = CoordinatorCore(store, FakeRunner(), FakeRunner(), clock, Path("/tmp/libra-runs"),
                           tool_catalog=catalog)
    return core, store


def spec(fmt: str = "hermes", tools: str = '["search", "calculator"]') -> str:
    model = '[model]\nkind = "hf"\npath = "/m"\n' if fmt == "hermes" else ""
    return (f'name = "t"\n{model}[task]\ntool_call_format = "{fmt}"\n'
            f'[tools]\nenabled = {tools}\n[algorithm]\nnum_steps = 2\n')


async def test_the_enabled_tools_schemas_are_frozen_into_the_stored_spec() -> None:
    core, _ = build(FakeCatalog())
    job = await core.create_job(spec(), "toml")
    stored = job_spec_from_json(job.spec_json)
    assert [s.name for s in stored.tools.schemas] == ["search", "calculator"]
    assert json.loads(stored.tools.schemas[1].parameters_json) == CATALOG[0]["args_schema"]
    assert stored.tools.schemas[1].description == "Evaluate arithmetic."


async def test_schemas_given_by_the_user_are_replaced_by_the_gateways() -> None:
    core, _ = build(FakeCatalog())
    text = spec(tools='["calculator"]') + (
        '[[tools.schemas]]\nname = "calculator"\ndescription = "forged"\n')
    job = await core.create_job(text, "toml")
    assert job_spec_from_json(job.spec_json).tools.schemas[0].description == (
        "Evaluate arithmetic.")


async def test_a_tool_the_gateway_lacks_is_refused_naming_the_available_ones() -> None:
    core, store = build(FakeCatalog(tools=CATALOG[:1]))
    with pytest.raises(InvalidArgument) as err:
        await core.create_job(spec(), "toml")
    assert err.value.field == "tools.enabled[0]"
    assert "has no tool 'search' (it has: calculator)" in err.value.reason
    assert await store.list_jobs() == []


async def test_a_chat_job_is_refused_while_the_gateway_is_down() -> None:
    core, store = build(FakeCatalog(down=True))
    with pytest.raises(Unavailable, match="needs its tools' schemas at submit"):
        await core.create_job(spec(), "toml")
    assert await store.list_jobs() == []


async def test_an_arith_job_does_not_need_the_gateway_at_submit() -> None:
    core, _ = build(FakeCatalog(down=True))
    job = await core.create_job(spec(fmt="arith", tools='["calculator"]'), "toml")
    assert job_spec_from_json(job.spec_json).tools.schemas == []


async def test_a_plugin_reward_the_gateway_registered_is_accepted() -> None:
    core, _ = build(FakeCatalog())
    job = await core.create_job(spec() + '[reward]\nname = "my_verifier"\n', "toml")
    assert job_spec_from_json(job.spec_json).reward.name == "my_verifier"


@pytest.mark.parametrize("reward, field", [
    ('[reward]\nname = "nope"\n', "reward.name"),
    ('[reward]\nname = "composite"\n[[reward.components]]\nname = "format"\n'
     '[[reward.components]]\nname = "nope"\nweight = 0.5\n', "reward.components[1].name"),
])
async def test_a_reward_the_gateway_lacks_is_refused_naming_the_available_ones(
        reward: str, field: str) -> None:
    core, store = build(FakeCatalog())
    with pytest.raises(InvalidArgument) as err:
        await core.create_job(spec() + reward, "toml")
    assert err.value.field == field
    assert ("has no reward 'nope' (it has: composite, exact_match, format, my_verifier)"
            in err.value.reason)
    assert await store.list_jobs() == []


async def test_an_agent_neither_built_in_nor_installed_is_refused_at_submit() -> None:
    core, store = build(FakeCatalog())
    text = spec().replace('[task]\n', '[task]\nagent = "react"\n')
    with pytest.raises(InvalidArgument) as err:
        await core.create_job(text, "toml")
    assert err.value.field == "task.agent" and "available: auto, arith, chat" in err.value.reason
    assert await store.list_jobs() == []
