"""``format`` reward: the trajectory is well formed (a good second composite component).

Half the score for a final answer (the last turn ended without a call and said
something), half for the share of tool calls that were well formed (reached a tool: not
an unknown name, bad JSON or bad arguments); a trajectory without calls gets that half
in full. Both parts are reported as components.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.toolgateway.rewards.base import RewardOutput

if TYPE_CHECKING:
    from services.toolgateway.rewards.base import ScoreRequest

# The tool name of a return for a call that never reached a tool (the rollout's
# services/rollout/agent.py INVALID_TOOL_TYPE; the gateway cannot import the rollout).
INVALID_CALL = "invalid"


class FormatReward:
    """0.5 x final answer present + 0.5 x share of well-formed tool calls."""

    name = "format"
    description = "Final answer present and tool calls well formed (0.5 each)."

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """Read the transcript's tool messages and the final text."""
        returns = [m for m in request.messages if m.role == "tool"]
        num_bad = sum(1 for m in returns if m.name == INVALID_CALL)
        well_formed = 1.0 - num_bad / len(returns) if returns else 1.0
        has_answer = 1.0 if request.final_text.strip() else 0.0
        return RewardOutput(
            reward=0.5 * has_answer + 0.5 * well_formed,
            details={"num_tool_calls": len(returns), "num_malformed": num_bad},
            components={"final_answer": has_answer, "well_formed_calls": well_formed})
