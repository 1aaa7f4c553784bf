"""How a tool call's budget becomes deadlines on both sides of the gateway RPC (pure).

The rollout gives each call a budget (``deadline_ms``, its remaining time). The tool
gateway enforces it itself: the tool runs under it (the sandbox kills its process group
at the limit), and the core's backstop cancels a tool that ignores it
``timeout_grace_ms`` later; then it answers ``timeout``. The client's RPC deadline is
only there for a gateway that never answers, so it is the budget plus the longest the
gateway may take past the budget to answer (``ANSWER_MARGIN_S``).

Both ends count the budget from the caller's send: the gateway caps what it enforces by
the RPC's own deadline (gRPC carries it), less the time it needs to answer
(``gateway_budget_ms``). A call that started late on the gateway (its event loop busy,
the request queued) gets what is left of the caller's budget, not the whole budget from
its arrival, so its answer, a success just inside the limit or the backstop's
``timeout``, still reaches the caller before its deadline. A margin alone could not
cover that lag, which has no bound under load (the margin was 1 s, and a tool that
finished on time was reported as a timeout when the call started late).

Scoring a trajectory (``Score``) follows the same rule with no backstop: the gateway
times the reward out itself at the job's ``reward.timeout_s`` (cancelling it), so the
client waits that plus ``ANSWER_SEND_S`` (``score_rpc_timeout_s``) and the gateway cuts
the reward's time to the RPC's deadline less ``ANSWER_SEND_S`` (``gateway_budget_ms``
with a grace of 0). The rollout used to wait the reward's time plus a 5 s margin while
the gateway counted the whole time from the call's arrival: a Score that started more
than 5 s late failed as the client's DeadlineExceeded, not as the reward's own timeout.
"""

from __future__ import annotations

# The gateway's default backstop grace (``ToolGatewayLimits.timeout_grace_ms``).
BACKSTOP_GRACE_S = 0.5
# After the backstop, until the answer is on its way: the sandbox's clean-up of a
# cancelled run (its process group and uid killed, its working dir removed: a
# subprocess start and a directory walk, slower on a loaded host) and the reply's trip.
ANSWER_SEND_S = 1.0
# The longest the gateway may take past a call's budget to answer (the client waits this
# much more before it reports the call as timed out by itself).
ANSWER_MARGIN_S = BACKSTOP_GRACE_S + ANSWER_SEND_S
# Least RPC deadline for a call: a budget of 1 ms still gets the gateway's answer.
MIN_BUDGET_S = 0.1


def rpc_timeout_s(budget_ms: int) -> float:
    """The client's RPC deadline for a call with ``budget_ms`` left."""
    return max(budget_ms / 1000.0, MIN_BUDGET_S) + ANSWER_MARGIN_S


def gateway_budget_ms(budget_ms: int | None, rpc_remaining_s: float | None,
                      backstop_grace_s: float) -> int | None:
    """What the gateway enforces: the caller's budget, cut so that its answer (after its
    own backstop grace and ``ANSWER_SEND_S``) comes before the RPC deadline. ``None``
    (no budget and no RPC deadline): no limit but the tool's own; at most 0 when the
    time is already spent (the core refuses such a call as DeadlineExceeded)."""
    if rpc_remaining_s is None:
        return budget_ms
    answer_by_ms = int((rpc_remaining_s - backstop_grace_s - ANSWER_SEND_S) * 1000)
    return answer_by_ms if budget_ms is None else min(budget_ms, answer_by_ms)


def score_rpc_timeout_s(reward_timeout_s: float) -> float:
    """The client's RPC deadline for a Score whose reward may take ``reward_timeout_s``:
    the gateway's own timeout cancels the reward at once (no backstop grace), then the
    answer is sent."""
    return max(reward_timeout_s, MIN_BUDGET_S) + ANSWER_SEND_S
