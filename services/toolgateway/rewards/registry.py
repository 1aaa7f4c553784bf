"""Reward registry: name -> reward, with entry-point and dotted-path loading of user
rewards."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from libra.plugins import REWARDS_GROUP, PluginError, load_entry_points, load_object
from services.toolgateway.errors import UnknownReward
from services.toolgateway.rewards.base import Reward


def check_reward(obj: Any, origin: str) -> Reward:
    """Check the ``Reward`` contract (``name``, ``description``, ``async score``).

    Raises:
        PluginError: The object does not honour the contract.
    """
    missing = [a for a in ("name", "description") if not hasattr(obj, a)]
    if missing:
        raise PluginError(f"reward {origin!r} lacks attribute(s) {', '.join(missing)}")
    if not inspect.iscoroutinefunction(getattr(obj, "score", None)):
        raise PluginError(f"reward {origin!r} must define 'async def score(self, request)'")
    return obj


def make_reward(obj: Any, origin: str) -> Reward:
    """A reward from a plugin object: a class is instantiated with no arguments."""
    if inspect.isclass(obj):
        obj = obj()
    return check_reward(obj, origin)


def load_reward(path: str) -> Reward:
    """Resolve a dotted path to a reward (instantiating a class with no arguments)."""
    return make_reward(load_object(path), path)


def entry_point_rewards() -> list[Reward]:
    """The rewards installed distributions register in the ``libra.rewards`` group.

    Raises:
        PluginError: An entry point fails to import or is not a reward (named).
    """
    return [make_reward(obj, f"entry point {name!r}")
            for name, obj in load_entry_points(REWARDS_GROUP)]


class RewardRegistry:
    """Holds rewards by name."""

    def __init__(self, rewards: Iterable[Reward] = ()) -> None:
        self._rewards: dict[str, Reward] = {}
        for reward in rewards:
            self.register(reward)

    def register(self, reward: Reward) -> None:
        """Add a reward; names must be unique."""
        check_reward(reward, getattr(reward, "name", repr(reward)))
        if reward.name in self._rewards:
            raise ValueError(f"reward name {reward.name!r} registered twice")
        self._rewards[reward.name] = reward

    def get(self, name: str) -> Reward:
        """Return the reward or raise ``UnknownReward`` listing the known names."""
        try:
            return self._rewards[name]
        except KeyError:
            raise UnknownReward(name, self._rewards) from None

    def names(self) -> list[str]:
        """Registered reward names, sorted."""
        return sorted(self._rewards)

    def __iter__(self):
        return iter(self._rewards.values())
