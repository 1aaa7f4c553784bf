"""The elastic hybrid pool of the simulator: rollout nodes lent to training.

A lent node is torn down as a rollout node (its trajectories handed back), fetches the
training state over the network (``fetch_s``) and then adds one DP replica to training
(``on_join_active``); a released node is brought back up as a rollout node with its
old pattern. ``reserve_nodes`` rollout nodes are never lent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

NodePattern = tuple[int, ...]


class HybridPool:
    """Which nodes are lent, joining or active, and the moves made.

    Args:
        teardown: Removes a rollout node's instances (the simulator's).
        bring_up: Re-creates a rollout node with a pattern (weights load, then live).
        join_at: Schedules ``on_join_active(node)`` at a time.
        fetch_s: Time a lent node takes to fetch the training state.
        reserve_nodes: Rollout nodes never lent.
        node_patterns: The live rollout nodes' patterns (read only).
    """

    def __init__(
        self,
        *,
        teardown: Callable[[int, float], object],
        bring_up: Callable[[int, NodePattern, float], None],
        join_at: Callable[[float, int], None],
        fetch_s: float,
        reserve_nodes: int,
        node_patterns: Mapping[int, NodePattern],
    ) -> None:
        self._teardown, self._bring_up, self._join_at = teardown, bring_up, join_at
        self._fetch_s, self._reserve = fetch_s, reserve_nodes
        self._node_patterns = node_patterns
        self.nodes: list[int] = []
        self.active: set[int] = set()
        self._patterns: dict[int, NodePattern] = {}
        self.moves = 0

    @property
    def joining(self) -> int:
        """Lent nodes still fetching the training state."""
        return len(self.nodes) - len(self.active)

    def resize(self, desired: int, rollout_nodes: list[int], now: float) -> None:
        """Lend the highest-numbered rollout nodes or return the latest lent ones."""
        current = len(self.nodes)
        rollout_nodes = list(rollout_nodes)
        while desired > current and len(rollout_nodes) > self._reserve:
            node = rollout_nodes.pop()
            self._patterns[node] = self._node_patterns[node]
            self._teardown(node, now)
            self.nodes.append(node)
            self._join_at(now + self._fetch_s, node)
            self.moves += 1
            current += 1
        while desired < current:
            self._release(self.nodes[-1], now)
            current -= 1

    def release_all(self, now: float) -> None:
        """Return every lent node (a new core plan replaces the layout)."""
        for node in list(self.nodes):
            self._release(node, now)

    def on_join_active(self, node: int) -> None:
        """A lent node finished its fetch (ignored if it was returned meanwhile)."""
        if node in self.nodes:
            self.active.add(node)

    def _release(self, node: int, now: float) -> None:
        self.nodes.remove(node)
        self.active.discard(node)
        self.moves += 1
        self._bring_up(node, self._patterns.pop(node), now)
