"""``composite`` reward: the weighted sum of other registered rewards.

The job lists the parts (``[[reward.components]] name, weight``); they arrive in the
request's ``options["components"]``. Each part is scored on the same request and must
honour the reward contract itself; its score is recorded under its name in
``components`` (and its details under ``details[name]``). The total lies in
[0, sum of weights].
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.toolgateway.rewards.base import RewardContractError, RewardOutput, check_output

if TYPE_CHECKING:
    from services.toolgateway.rewards.base import ScoreRequest
    from services.toolgateway.rewards.registry import RewardRegistry


def composite_weights(options: dict) -> list[tuple[str, float]]:
    """``[(name, weight), ...]`` from a request's options (empty when none given)."""
    return [(str(c["name"]), float(c.get("weight", 1.0)))
            for c in options.get("components", [])]


class CompositeReward:
    """Scores every component with the registry's rewards and sums them by weight."""

    name = "composite"
    description = "Weighted sum of other rewards ([[reward.components]] name, weight)."

    def __init__(self, registry: RewardRegistry) -> None:
        self._registry = registry

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """Each component in turn (in the spec's order)."""
        parts = composite_weights(request.options)
        if not parts:
            raise RewardContractError("composite reward without components (the spec's "
                                      "[[reward.components]])")
        total, scores, details = 0.0, {}, {}
        for name, weight in parts:
            if name == self.name:
                raise RewardContractError("a composite cannot contain a composite")
            out = check_output(name, await self._registry.get(name).score(request))
            scores[name] = float(out.reward)
            details[name] = dict(out.details)
            total += weight * float(out.reward)
        return RewardOutput(reward=total, details=details, components=scores)
