"""The causal prefix tree behind C-MLFQ (design digest section 3.1).

Finished trajectories are inserted as their sequence of tool-return keys
(``"type:size:status"``) labelled with the realised remaining length after each
return. At a tool return C-MLFQ looks up the node for the path observed so far and
maps its mean and P90 of remaining length to buckets.

Each prompt has its own root (root statistic = total output length) and a global root
aggregates the same paths over all prompts, so evidence carries over to unseen prompts.
The tree is plain in-memory state; persistence goes through ``to_dict``/``from_dict``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_WINDOW_SAMPLES = 200
_SNAPSHOT_VERSION = 1


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (NumPy's default) of a sorted, non-empty sequence."""
    position = q * (len(sorted_values) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    fraction = position - lower
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * fraction


class PrefixTreeNode:
    """One node: statistics of remaining length after the path that leads here.

    Attributes:
        key: The tool-return key on the edge into this node ("" for roots).
        depth: Number of tool returns on the path (0 for roots).
        visit_count: Number of trajectories that passed through this node.
        mean_tokens: Running mean of remaining length over all visits.
        children: Child nodes keyed by tool-return key.
    """

    __slots__ = ("key", "depth", "visit_count", "mean_tokens", "children", "_window", "_p90")

    def __init__(self, key: str, depth: int, window_samples: int) -> None:
        self.key = key
        self.depth = depth
        self.visit_count = 0
        self.mean_tokens = 0.0
        self.children: dict[str, PrefixTreeNode] = {}
        self._window: deque[float] = deque(maxlen=window_samples)
        # Cached P90 of the window, None when stale. Inserts only invalidate it, so a
        # lookup sorts at most once per node per insert instead of once per decision.
        self._p90: float | None = None

    @property
    def samples(self) -> tuple[float, ...]:
        """The most recent remaining-length samples (bounded window), oldest first."""
        return tuple(self._window)

    @property
    def p90_tokens(self) -> float:
        """P90 of the sample window (0.0 when the node has no samples)."""
        if self._p90 is None:
            self._p90 = quantile(sorted(self._window), 0.9) if self._window else 0.0
        return self._p90

    def record(self, remaining_tokens: float) -> None:
        """Add one visit with its realised remaining length."""
        self.visit_count += 1
        self.mean_tokens += (remaining_tokens - self.mean_tokens) / self.visit_count
        self._window.append(remaining_tokens)
        self._p90 = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able snapshot of this node and its subtree."""
        return {
            "key": self.key,
            "visits": self.visit_count,
            "mean": self.mean_tokens,
            "window": list(self._window),
            "children": [child.to_dict() for child in self.children.values()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], depth: int, window_samples: int) -> PrefixTreeNode:
        """Rebuild a node and its subtree from ``to_dict`` output."""
        node = cls(data["key"], depth, window_samples)
        node.visit_count = int(data["visits"])
        node.mean_tokens = float(data["mean"])
        node._window.extend(data["window"])
        for child_data in data["children"]:
            child = cls.from_dict(child_data, depth + 1, window_samples)
            node.children[child.key] = child
        return node

    def count_nodes(self) -> tuple[int, int]:
        """Return (number of nodes, maximum depth) of this subtree."""
        num_nodes, max_depth = 1, self.depth
        for child in self.children.values():
            child_nodes, child_depth = child.count_nodes()
            num_nodes += child_nodes
            max_depth = max(max_depth, child_depth)
        return num_nodes, max_depth


@dataclass(frozen=True, slots=True)
class RecentTrajectory:
    """One finished trajectory as kept in the recent ring (the rebuild source)."""

    prompt_id: str
    path_keys: tuple[str, ...]
    remaining_tokens: tuple[int, ...]
    total_tokens: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the policy store."""
        return {
            "prompt_id": self.prompt_id,
            "path_keys": list(self.path_keys),
            "remaining_tokens": list(self.remaining_tokens),
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RecentTrajectory:
        """Inverse of ``to_dict``."""
        return cls(
            prompt_id=data["prompt_id"],
            path_keys=tuple(data["path_keys"]),
            remaining_tokens=tuple(data["remaining_tokens"]),
            total_tokens=int(data["total_tokens"]),
        )


@dataclass(frozen=True, slots=True)
class TreeStats:
    """Size statistics of a tree."""

    num_prompts: int
    num_nodes: int
    max_depth: int
    num_insertions: int


class CausalPrefixTree:
    """Per-prompt roots plus a global root, all keyed by tool-return paths.

    Args:
        window_samples: Size of each node's sample window for P90 (reference 200).

    Not thread-safe: the owner (one policy instance) serialises access.
    """

    def __init__(self, window_samples: int = DEFAULT_WINDOW_SAMPLES) -> None:
        if window_samples <= 0:
            raise ValueError(f"window_samples must be positive, got {window_samples}")
        self._window_samples = window_samples
        self._init_roots()

    def _init_roots(self) -> None:
        self._global_root = PrefixTreeNode("", 0, self._window_samples)
        self._prompt_roots: dict[str, PrefixTreeNode] = {}
        self._num_insertions = 0

    @property
    def global_root(self) -> PrefixTreeNode:
        """Root aggregating every prompt's paths."""
        return self._global_root

    @property
    def window_samples(self) -> int:
        """Per-node sample window size."""
        return self._window_samples

    def has_prompt(self, prompt_id: str) -> bool:
        """Whether ``prompt_id`` has its own root."""
        return prompt_id in self._prompt_roots

    def insert(
        self,
        prompt_id: str,
        path_keys: Sequence[str],
        remaining_tokens_per_step: Sequence[float],
        total_tokens: float,
    ) -> None:
        """Add one finished trajectory to its prompt's root and to the global root.

        Args:
            prompt_id: The prompt the trajectory was sampled from.
            path_keys: Tool-return keys in order.
            remaining_tokens_per_step: Realised remaining length after each return.
            total_tokens: Total post-prompt tokens (the root statistic).

        Raises:
            ValueError: If the two sequences differ in length.
        """
        if len(path_keys) != len(remaining_tokens_per_step):
            raise ValueError(
                "remaining_tokens_per_step must have one entry per path key, got "
                f"{len(remaining_tokens_per_step)} for {len(path_keys)} keys"
            )
        root = self._prompt_roots.get(prompt_id)
        if root is None:
            root = self._prompt_roots[prompt_id] = PrefixTreeNode("", 0, self._window_samples)
        for start in (root, self._global_root):
            self._insert_path(start, path_keys, remaining_tokens_per_step, total_tokens)
        self._num_insertions += 1

    def _insert_path(
        self,
        root: PrefixTreeNode,
        path_keys: Sequence[str],
        remaining_tokens_per_step: Sequence[float],
        total_tokens: float,
    ) -> None:
        root.record(total_tokens)
        node = root
        for key, remaining_tokens in zip(path_keys, remaining_tokens_per_step, strict=True):
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = PrefixTreeNode(
                    key, node.depth + 1, self._window_samples
                )
            child.record(remaining_tokens)
            node = child

    def lookup(self, prompt_id: str | None, path_keys: Sequence[str]) -> PrefixTreeNode | None:
        """Exact lookup: the node at ``path_keys`` or ``None`` on any mismatch.

        ``prompt_id=None`` walks the global root.
        """
        node = self._global_root if prompt_id is None else self._prompt_roots.get(prompt_id)
        for key in path_keys:
            if node is None:
                return None
            node = node.children.get(key)
        return node

    def lookup_with_fallback(self, prompt_id: str, path_keys: Sequence[str]) -> PrefixTreeNode:
        """Deepest node matching a prefix of ``path_keys``.

        Walks the prompt's own root when it has one, else the global root (so tool
        evidence transfers to unseen prompts). The result can be a root, and can have
        zero visits when the tree is empty.
        """
        node = self._prompt_roots.get(prompt_id) or self._global_root
        for key in path_keys:
            child = node.children.get(key)
            if child is None:
                break
            node = child
        return node

    def deepest(self, prompt_id: str | None, path_keys: Sequence[str]) -> PrefixTreeNode | None:
        """Deepest node matching a prefix of ``path_keys`` under one root.

        ``prompt_id=None`` walks the global root; a prompt without a root gives ``None``.
        """
        node = self._global_root if prompt_id is None else self._prompt_roots.get(prompt_id)
        if node is None:
            return None
        for key in path_keys:
            child = node.children.get(key)
            if child is None:
                break
            node = child
        return node

    def rebuild(self, recent: Iterable[RecentTrajectory]) -> None:
        """Forget everything and re-insert ``recent`` (oldest first).

        This is how drift is handled: evidence older than the recent window is dropped.
        """
        self._init_roots()
        for trajectory in recent:
            self.insert(
                trajectory.prompt_id,
                trajectory.path_keys,
                trajectory.remaining_tokens,
                trajectory.total_tokens,
            )

    def stats(self) -> TreeStats:
        """Size statistics (walks the tree: call it for reporting, not per decision)."""
        num_nodes, max_depth = 0, 0
        for root in (self._global_root, *self._prompt_roots.values()):
            root_nodes, root_depth = root.count_nodes()
            num_nodes += root_nodes
            max_depth = max(max_depth, root_depth)
        return TreeStats(len(self._prompt_roots), num_nodes, max_depth, self._num_insertions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able snapshot; ``from_dict(to_dict())`` reproduces every statistic."""
        return {
            "version": _SNAPSHOT_VERSION,
            "window_samples": self._window_samples,
            "num_insertions": self._num_insertions,
            "global_root": self._global_root.to_dict(),
            "prompt_roots": {pid: root.to_dict() for pid, root in self._prompt_roots.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CausalPrefixTree:
        """Rebuild a tree from ``to_dict`` output.

        Raises:
            ValueError: If the snapshot version is not supported.
        """
        if data.get("version") != _SNAPSHOT_VERSION:
            raise ValueError(f"prefix tree snapshot version {data.get('version')!r} not supported")
        tree = cls(int(data["window_samples"]))
        tree._num_insertions = int(data["num_insertions"])
        tree._global_root = PrefixTreeNode.from_dict(data["global_root"], 0, tree._window_samples)
        tree._prompt_roots = {
            pid: PrefixTreeNode.from_dict(root, 0, tree._window_samples)
            for pid, root in data["prompt_roots"].items()
        }
        return tree
