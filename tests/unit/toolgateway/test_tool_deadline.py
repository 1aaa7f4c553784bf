"""The arithmetic of a tool call's deadlines (libra/tool_deadline.py): whatever the
gateway's lag in starting the call, its answer is due before the client's deadline."""

from __future__ import annotations

import pytest

from libra.tool_deadline import (
    ANSWER_MARGIN_S,
    ANSWER_SEND_S,
    BACKSTOP_GRACE_S,
    gateway_budget_ms,
    rpc_timeout_s,
    score_rpc_timeout_s,
)
from services.toolgateway.core import ToolGatewayLimits


def test_the_gateway_default_backstop_is_the_one_the_margin_leaves_room_for() -> None:
    assert ToolGatewayLimits().timeout_grace_ms / 1000 == BACKSTOP_GRACE_S
    assert ANSWER_MARGIN_S == BACKSTOP_GRACE_S + ANSWER_SEND_S


@pytest.mark.parametrize("budget_ms", [1, 500, 2000, 30_000])
@pytest.mark.parametrize("start_lag_s", [0.0, 0.4, 1.0, 1.4, 5.0])
@pytest.mark.parametrize("grace_s", [BACKSTOP_GRACE_S, 0.05, 2.0])
def test_the_gateways_latest_answer_comes_before_the_clients_deadline(
        budget_ms: int, start_lag_s: float, grace_s: float) -> None:
    """The gateway answers by start + its budget + its backstop grace + ANSWER_SEND_S;
    the client gives up at ``rpc_timeout_s``. A gateway configured with another grace
    cuts its own budget rather than answer late."""
    client_deadline_s = rpc_timeout_s(budget_ms)
    enforced_ms = gateway_budget_ms(budget_ms, client_deadline_s - start_lag_s, grace_s)
    assert enforced_ms is not None and enforced_ms <= budget_ms
    if enforced_ms <= 0:
        return  # refused as DeadlineExceeded at once: an answer, not a wait
    latest_answer_s = start_lag_s + enforced_ms / 1000 + grace_s + ANSWER_SEND_S
    assert latest_answer_s <= client_deadline_s


def test_without_a_lag_the_budget_is_enforced_whole() -> None:
    assert gateway_budget_ms(2000, rpc_timeout_s(2000), BACKSTOP_GRACE_S) == 2000


def test_no_rpc_deadline_leaves_the_budget_and_no_budget_takes_the_rpc_deadline() -> None:
    assert gateway_budget_ms(700, None, BACKSTOP_GRACE_S) == 700
    assert gateway_budget_ms(None, None, BACKSTOP_GRACE_S) is None
    assert gateway_budget_ms(None, 10.0, BACKSTOP_GRACE_S) == 8500


@pytest.mark.parametrize("reward_timeout_s", [0.001, 1.0, 30.0])
@pytest.mark.parametrize("start_lag_s", [0.0, 0.5, 5.0, 20.0])
def test_a_scores_latest_answer_comes_before_the_clients_deadline(
        reward_timeout_s: float, start_lag_s: float) -> None:
    """Score has no backstop (the reward's timeout cancels it): the gateway answers by
    start + the reward's time, cut to what the RPC left less ANSWER_SEND_S, + ANSWER_SEND_S."""
    client_deadline_s = score_rpc_timeout_s(reward_timeout_s)
    enforced_ms = gateway_budget_ms(None, client_deadline_s - start_lag_s, 0.0)
    assert enforced_ms is not None
    if enforced_ms <= 0:
        return  # refused as DeadlineExceeded at once
    enforced_s = min(reward_timeout_s, enforced_ms / 1000)
    assert start_lag_s + enforced_s + ANSWER_SEND_S <= client_deadline_s
