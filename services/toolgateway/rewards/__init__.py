"""Reward plugins: the contract (``base``), the registry, and the built-in rewards."""

from __future__ import annotations

from collections.abc import Iterable

from services.toolgateway.rewards.base import (
    Reward,
    RewardContractError,
    RewardOutput,
    check_output,
)
from services.toolgateway.rewards.code_tests import CodeTestsReward
from services.toolgateway.rewards.composite import CompositeReward
from services.toolgateway.rewards.format import FormatReward
from services.toolgateway.rewards.llm_judge import LlmJudgeConfig, LlmJudgeReward
from services.toolgateway.rewards.registry import (
    RewardRegistry,
    entry_point_rewards,
    load_reward,
)
from services.toolgateway.rewards.simple import ExactMatchReward, NumericReward
from services.toolgateway.sandbox import Sandbox


def builtin_rewards(sandbox: Sandbox, judge: LlmJudgeConfig | None = None) -> list[Reward]:
    """exact_match, numeric, code_tests (in ``sandbox``), format and llm_judge (``judge``:
    the gateway's default endpoint; jobs bring their own in ``[reward.llm_judge]``)."""
    return [ExactMatchReward(), NumericReward(), CodeTestsReward(sandbox), FormatReward(),
            LlmJudgeReward(judge)]


def build_reward_registry(sandbox: Sandbox, extra_paths: Iterable[str] = (),
                          judge: LlmJudgeConfig | None = None) -> RewardRegistry:
    """The gateway's rewards: built-ins, then ``libra.rewards`` entry points, then the
    config's dotted paths, then ``composite`` over all of them.

    Raises:
        PluginError: A plugin fails to import or breaks the contract (named).
        ValueError: Two rewards share a name.
    """
    registry = RewardRegistry(builtin_rewards(sandbox, judge))
    for reward in entry_point_rewards():
        registry.register(reward)
    for path in extra_paths:
        registry.register(load_reward(path))
    registry.register(CompositeReward(registry))
    return registry


__all__ = ["CodeTestsReward", "CompositeReward", "ExactMatchReward", "FormatReward",
           "LlmJudgeConfig", "LlmJudgeReward", "NumericReward", "Reward",
           "RewardContractError", "RewardOutput", "RewardRegistry", "build_reward_registry",
           "builtin_rewards", "check_output", "load_reward"]
