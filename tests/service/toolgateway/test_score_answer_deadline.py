"""A Score's client deadline catches only a gateway that never answers (as a tool
call's does: test_tool_answer_deadline.py).

A real gateway over gRPC (the real servicer and core, a plugin reward that never
returns by itself) whose event loop is loaded: each Score starts ``START_LAG_S`` after it
arrived and its answer leaves ``ANSWER_LAG_S`` after the reward was timed out. Before,
the rollout waited the reward's time + 5 s while the gateway counted the whole reward
time from the call's arrival: with a start 5.2 s late, the gateway's answer (the reward's
own timeout, naming it) came after the client's deadline by construction (sleeps only
ever run long), and the trajectory failed with the client's DeadlineExceeded. The
gateway now cuts the reward's time to the RPC's deadline less its answer time
(libra/tool_deadline.py), so its answer lands in time, and the client waits only the
reward's time + ``ANSWER_SEND_S``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable
from typing import Any

import pytest

from libra import types as t
from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.errors import DeadlineExceeded, Internal
from libra.tool_deadline import ANSWER_SEND_S, score_rpc_timeout_s
from services.toolgateway.__main__ import build_core
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ScoreRequest
from services.toolgateway.rewards.base import RewardOutput
from services.toolgateway.servicer import ToolGatewayServicer
from tests.service.toolgateway.conftest import Gateway, StartGateway

REWARD_TIMEOUT_S = 6.0
START_LAG_S = 5.2  # past the old 5 s margin, inside the reward's time + ANSWER_SEND_S
ANSWER_LAG_S = 0.3
TRANSIT_SLACK_S = 1.0  # the request's transit, counted by the server's deadline


class StuckReward:
    """Never returns by itself: only the gateway's timeout ends it."""

    name = "stuck"
    description = "Waits until it is cancelled."

    async def score(self, request: ScoreRequest) -> RewardOutput:
        await asyncio.sleep(3600)
        return RewardOutput(0.0)


class LoadedServicer(ToolGatewayServicer):
    """The real servicer on a busy event loop: late to start, late to answer."""

    def __init__(self, *args: Any, start_lag_s: float) -> None:
        super().__init__(*args)
        self._start_lag_s = start_lag_s

    async def Score(self, request, context):  # noqa: N802, ANN001
        await asyncio.sleep(self._start_lag_s)
        try:
            return await super().Score(request, context)
        finally:
            await asyncio.sleep(ANSWER_LAG_S)


def started(start_gateway: StartGateway, start_lag_s: float) -> Awaitable[Gateway]:
    return start_gateway(lambda core: LoadedServicer(core, start_lag_s=start_lag_s),
                         extra_rewards=[f"{__name__}:StuckReward"])


@pytest.fixture
async def loaded(start_gateway: StartGateway) -> GrpcToolGatewayClient:
    return (await started(start_gateway, START_LAG_S)).client


@pytest.fixture
async def prompt(start_gateway: StartGateway) -> GrpcToolGatewayClient:
    return (await started(start_gateway, 0.0)).client


def stuck_score(timeout_s: float) -> t.ScoreInput:
    """A Score of the stuck reward as the rollout sends it (the job's reward options)."""
    return t.ScoreInput("traj", "stuck", "42", options_json=json.dumps({"timeout_s": timeout_s}))


def timed_out_after_s(exc: Internal) -> float:
    match = re.search(r"reward 'stuck' timed out after ([0-9.]+)s", str(exc))
    assert match, exc
    return float(match.group(1))


async def test_a_late_gateway_answers_with_the_rewards_timeout_before_the_clients_deadline(
        loaded: GrpcToolGatewayClient) -> None:
    """Before: DeadlineExceeded (the client's, naming no reward): 5.2 s late start + 6 s
    reward time + 0.3 s answer > 6 s + 5 s."""
    client_wait_s = score_rpc_timeout_s(REWARD_TIMEOUT_S)
    with pytest.raises(Internal) as caught:
        await loaded.score(stuck_score(REWARD_TIMEOUT_S), client_wait_s)
    # What was left of the client's wait when the Score started, less the answer time.
    # gRPC sends the deadline as a timeout that the server counts from the call's
    # arrival, so the request's transit (a few ms, more on a loaded host) comes on top;
    # the reward's own time (6 s) is far above either.
    left_s = client_wait_s - START_LAG_S - ANSWER_SEND_S
    assert timed_out_after_s(caught.value) <= left_s + TRANSIT_SLACK_S < REWARD_TIMEOUT_S


async def test_a_prompt_gateway_gives_the_reward_its_whole_time(
        prompt: GrpcToolGatewayClient) -> None:
    """The cut binds only on a late start (less the local RPC's own transit, far below
    the answer time)."""
    with pytest.raises(Internal) as caught:
        await prompt.score(stuck_score(1.0), score_rpc_timeout_s(1.0))
    assert timed_out_after_s(caught.value) == pytest.approx(1.0, abs=ANSWER_SEND_S / 2)


async def test_a_score_whose_deadline_passed_before_it_started_is_refused() -> None:
    """The core's refusal when nothing is left of the caller's deadline (the servicer
    passes what is left less the answer time)."""
    core = build_core(ToolGatewayConfig(extra_rewards=[f"{__name__}:StuckReward"]))
    with pytest.raises(DeadlineExceeded, match="reward 'stuck': the caller's deadline"):
        await core.score(ScoreRequest("traj", "stuck", "42", options={"timeout_s": 5.0}),
                         deadline_ms=0)
