"""C-MLFQ: the causality-guided bucket scheduler (design digest section 3.2).

New trajectories enter the shortest bucket. After every tool return the path of
tool-return keys is looked up in the causal prefix tree; the trajectory moves only
when the node's mean and P90 of remaining length map to the same bucket and that
bucket differs from the current one (moves go both ways). Finished trajectories teach
the tree; it is rebuilt from a recent window every ``rebuild_interval_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.scheduler.policy.base import (
    Decision,
    InstanceSource,
    Placement,
    Reason,
    TrajectoryDescriptor,
)
from services.scheduler.policy.layout import (
    BucketLayout,
    bucket_index_for_length,
    validate_thresholds,
)
from services.scheduler.policy.pinning import PinningPolicy
from services.scheduler.policy.prefix_tree import CausalPrefixTree, PrefixTreeNode, RecentTrajectory
from services.scheduler.policy.store import PolicyStore, TrajectoryRecord


@dataclass(frozen=True, kw_only=True, slots=True)
class CmlfqConfig:
    """C-MLFQ knobs. Defaults are the reference code's unless noted."""

    rebuild_interval_steps: int = 50
    """Rebuild the tree from the recent window every this many steps (0 = never).
    Reference 50; its 48-GPU Qwen3-14B config uses 5."""

    recent_window_trajectories: int = 5000
    """Finished trajectories kept in the recent ring that rebuilds read (reference 5,000)."""

    p90_window_samples: int = 200
    """Most recent samples per tree node used for P90 (reference 200)."""

    tree_persist_interval_finishes: int = 0
    """Save a tree snapshot every this many finishes; 0 = only at step ends. The reference
    uses 1; we default to 0 because the recent ring is already written on every finish
    and a whole-tree snapshot per finish costs milliseconds at 5,000 trajectories."""

    min_node_visits: int = 1
    """A node with fewer visits is treated as unseen and yields no move (reference 1)."""

    bucket_thresholds_tokens: tuple[int, ...] | None = None
    """Remaining-length thresholds mapping mean/P90 to buckets, one per bucket, short
    first. ``None`` uses the layout's ``max_tokens`` (the reference behaviour)."""

    enable_fallback: bool = True
    """Route to the nearest other bucket when the wanted one has no room (reference true)."""

    def __post_init__(self) -> None:
        for field_name in ("recent_window_trajectories", "p90_window_samples", "min_node_visits"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{field_name} must be positive, got {getattr(self, field_name)}")
        for field_name in ("rebuild_interval_steps", "tree_persist_interval_finishes"):
            if getattr(self, field_name) < 0:
                raise ValueError(f"{field_name} must be >= 0, got {getattr(self, field_name)}")
        if self.bucket_thresholds_tokens is not None:
            validate_thresholds("bucket_thresholds_tokens", self.bucket_thresholds_tokens)


class CmlfqPolicy(PinningPolicy):
    """C-MLFQ placement.

    The tree is held in memory by this object (a lookup per tool return must not cost a
    store round trip); the store keeps the recent ring and snapshots so that another
    replica or a restart can ``restore`` it.

    Args:
        layout: Bucket layout (the levels).
        store: Policy state.
        config: Knobs.

    Raises:
        ValueError: If ``config.bucket_thresholds_tokens`` does not have one entry per bucket.
    """

    name = "cmlfq"

    def __init__(self, layout: BucketLayout, store: PolicyStore, config: CmlfqConfig) -> None:
        super().__init__(layout, store, enable_fallback=config.enable_fallback)
        self._config = config
        self._thresholds_tokens = self._init_thresholds(layout, config)
        self._tree = CausalPrefixTree(config.p90_window_samples)
        self._finishes_since_persist = 0
        self._has_snapshot = False
        # Sequence number of the last trajectory learned from. Ring entries and snapshots
        # carry it so ``restore`` can replay exactly what a snapshot is missing.
        self._learn_seq = 0

    @staticmethod
    def _init_thresholds(layout: BucketLayout, config: CmlfqConfig) -> tuple[int, ...]:
        if config.bucket_thresholds_tokens is None:
            return tuple(bucket.max_tokens for bucket in layout.buckets)
        if len(config.bucket_thresholds_tokens) != len(layout):
            raise ValueError(
                f"bucket_thresholds_tokens needs {len(layout)} entries (one per bucket), got "
                f"{len(config.bucket_thresholds_tokens)}"
            )
        return config.bucket_thresholds_tokens

    @property
    def tree(self) -> CausalPrefixTree:
        """The live prefix tree (read-only use, e.g. reporting)."""
        return self._tree

    def restore(self) -> str:
        """Load the tree from the store: the snapshot if any, else rebuild from the ring.

        Ring entries learned after the snapshot was taken (those with a larger sequence
        number) are replayed on top of it, so a restart between two snapshots yields the
        tree the previous process had (as long as the ring still holds those entries).

        Returns:
            ``"snapshot"``, ``"ring"`` or ``"empty"``: where the tree came from.
        """
        snapshot = self._store.load_tree()
        recent = self._store.recent()
        self._learn_seq = max((int(data.get("seq", 0)) for data in recent), default=0)
        if snapshot is not None:
            self._has_snapshot = True
            self._tree = CausalPrefixTree.from_dict(snapshot)
            snapshot_seq = snapshot.get("learn_seq")
            if snapshot_seq is not None:
                self._learn_seq = max(self._learn_seq, int(snapshot_seq))
                for data in recent:
                    if int(data.get("seq", 0)) > snapshot_seq:
                        self._insert(RecentTrajectory.from_dict(data))
            return "snapshot"
        if recent:
            self._rebuild(recent)
            return "ring"
        return "empty"

    def bucket_for_node(self, node: PrefixTreeNode) -> str | None:
        """The agreed bucket of a node: set only when mean and P90 map to the same bucket."""
        mean_index = bucket_index_for_length(self._thresholds_tokens, node.mean_tokens)
        p90_index = bucket_index_for_length(self._thresholds_tokens, node.p90_tokens)
        if mean_index != p90_index:
            return None
        return self._layout.buckets[mean_index].name

    def on_step_end(self, step: int) -> None:
        """Rebuild from the recent window every ``rebuild_interval_steps`` and snapshot then.

        Snapshotting only at rebuilds keeps step ends cheap (a snapshot of a 5,000-
        trajectory tree costs ~0.3 s); ``restore`` replays the ring entries newer than the
        snapshot, so nothing learnt in between is lost.
        """
        interval = self._config.rebuild_interval_steps
        rebuilt = interval > 0 and step > 0 and step % interval == 0
        if rebuilt:
            self._rebuild(self._store.recent())
        if rebuilt or not self._has_snapshot:
            self._persist()
            self._has_snapshot = True

    def stats(self) -> dict[str, Any]:
        """Counters plus tree size."""
        tree_stats = self._tree.stats()
        return {
            **super().stats(),
            "tree_prompts": tree_stats.num_prompts,
            "tree_nodes": tree_stats.num_nodes,
            "tree_max_depth": tree_stats.max_depth,
            "tree_insertions": tree_stats.num_insertions,
        }

    def _place(self, trajectory: TrajectoryDescriptor, instances: InstanceSource) -> Placement:
        # New work enters the top (shortest) level whatever its prompt length.
        return self._place_in(
            trajectory, self._layout.shortest.name, Reason.SHORTEST_BUCKET, instances
        )

    def _decide(
        self, record: TrajectoryRecord, tokens_so_far: int, instances: InstanceSource
    ) -> Decision:
        node = self._tree.lookup_with_fallback(record.prompt_id, record.path_keys)
        if node.visit_count < self._config.min_node_visits:
            return self._stay(record, Reason.UNSEEN)
        target_bucket = self.bucket_for_node(node)
        if target_bucket is None:
            return self._stay(record, Reason.DISAGREE)
        if target_bucket == record.bucket:
            return self._stay(record, Reason.ALREADY_IN_TARGET, target_bucket)
        return self._move_to(record, target_bucket, Reason.MOVE, instances)

    def _learn(self, record: TrajectoryRecord, total_tokens: int) -> None:
        # Trajectories without tool returns carry no causal evidence (reference behaviour).
        if not record.path_keys:
            return
        remaining_tokens = tuple(max(0, total_tokens - pos) for pos in record.positions_tokens)
        recent = RecentTrajectory(
            record.prompt_id, tuple(record.path_keys), remaining_tokens, total_tokens
        )
        self._insert(recent)
        self._learn_seq += 1
        self._store.append_recent(
            {**recent.to_dict(), "seq": self._learn_seq}, self._config.recent_window_trajectories
        )
        self._finishes_since_persist += 1
        interval = self._config.tree_persist_interval_finishes
        if interval > 0 and self._finishes_since_persist >= interval:
            self._persist()

    def _rebuild(self, recent: list[dict[str, Any]]) -> None:
        self._tree.rebuild(RecentTrajectory.from_dict(data) for data in recent)
        self._counters["rebuilds"] += 1

    def _insert(self, recent: RecentTrajectory) -> None:
        self._tree.insert(
            recent.prompt_id, recent.path_keys, recent.remaining_tokens, recent.total_tokens
        )

    def _persist(self) -> None:
        self._store.save_tree({**self._tree.to_dict(), "learn_seq": self._learn_seq})
        self._finishes_since_persist = 0
