"""Reward plugins: the contract (``base``), the registry, and the built-in rewards."""

from __future__ import annotations

from services.toolgateway.rewards.base import Reward, RewardOutput
from services.toolgateway.rewards.code_tests import CodeTestsReward
from services.toolgateway.rewards.llm_judge import LlmJudgeConfig, LlmJudgeReward
from services.toolgateway.rewards.registry import RewardRegistry, load_reward
from services.toolgateway.rewards.simple import ExactMatchReward, NumericReward
from services.toolgateway.sandbox import Sandbox


def builtin_rewards(sandbox: Sandbox, judge: LlmJudgeConfig | None = None) -> list[Reward]:
    """exact_match, numeric, code_tests (in ``sandbox``) and, if configured, llm_judge."""
    rewards: list[Reward] = [ExactMatchReward(), NumericReward(), CodeTestsReward(sandbox)]
    if judge is not None:
        rewards.append(LlmJudgeReward(judge))
    return rewards


__all__ = ["CodeTestsReward", "ExactMatchReward", "LlmJudgeConfig", "LlmJudgeReward",
           "NumericReward", "Reward", "RewardOutput", "RewardRegistry", "builtin_rewards",
           "load_reward"]
