"""C-MLFQ: the causality-guided bucket scheduler (design digest section 3.2).

After every tool return the path of tool-return keys is looked up in the causal prefix
tree and the trajectory may move to the bucket the node's remaining length maps to
(moves go both ways). Finished trajectories teach the tree; it is rebuilt from a recent
window every ``rebuild_interval_steps``. Libra's rules (issue 20; each a knob, the
reference behaviour one setting away):

- **thresholds from the live layout** (``live_thresholds``): only buckets with a live
  instance, split by their GPU share of recent lengths, the longest unbounded above
  (``thresholds.live_thresholds``): every bucket is reachable;
- **entry** (``entry="predict"``): a new trajectory enters the bucket its prompt root
  (else the global root) predicts when that root has evidence and its mean and P90
  agree; otherwise it goes by load (least-loaded instance of any bucket, shortest
  bucket first on ties). The reference (``"shortest"``) puts all new work in the
  shortest bucket;
- **mean/P90 disagreement** (``disagree_rule="clamp"``): the evidence spans the buckets
  from bucket(mean) to bucket(P90); a trajectory already in that span stays, one
  outside it moves to the nearest bucket of the span. The reference (``"stay"``)
  never moves on disagreement, which stalled about a third of the decisions;
- **per-instance queue length** (``max_queue_length``, reference 48-GPU config: 3):
  a predicted entry prefers instances of its bucket holding fewer than this many
  trajectories; when none does, it goes by load (the reference's global fallback);
- **minimum visits** (``min_node_visits``): a node with fewer visits is no evidence;
  the prompt's node and the global node at the same path are tried, deeper first.
"""

from __future__ import annotations

import bisect
import collections
import math
from dataclasses import dataclass
from typing import Any

from scheduling.policy.base import (
    Decision,
    InstanceSource,
    Placement,
    Reason,
    TrajectoryDescriptor,
    resolve_instances,
)
from scheduling.policy.layout import (
    BucketLayout,
    bucket_index_for_length,
    validate_thresholds,
)
from scheduling.policy.load_index import LoadIndex
from scheduling.policy.pinning import PinningPolicy
from scheduling.policy.prefix_tree import CausalPrefixTree, PrefixTreeNode, RecentTrajectory
from scheduling.policy.routing import (
    RouteKind,
    RouteResult,
    route_by_load,
    route_with_queue_length,
)
from scheduling.policy.store import PolicyStore, TrajectoryRecord
from scheduling.policy.thresholds import live_gpu_shares, live_thresholds

LENGTH_WINDOW_SAMPLES = 2000
"""Recent mapped lengths (totals and remaining-after-return) the live thresholds split."""
ENTRY_RULES = ("predict", "shortest")
DISAGREE_RULES = ("clamp", "stay")


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

    min_node_visits: int = 10
    """A node with fewer visits is no evidence (reference 1). 10: with fewer samples the
    P90 (linear interpolation) lies between the two largest, i.e. it is a maximum."""

    bucket_thresholds_tokens: tuple[int, ...] | None = None
    """Remaining-length thresholds mapping mean/P90 to buckets, one per bucket, short
    first. ``None``: derived (``live_thresholds``) or the layout's ``max_tokens``."""

    live_thresholds: bool = True
    """Derive thresholds from the live layout and recent lengths (module docstring);
    false: the layout's ``max_tokens`` (the reference behaviour)."""

    entry: str = "predict"
    """``predict`` (tree prediction with evidence, else by load) or ``shortest``
    (reference: every new trajectory enters the shortest bucket)."""

    disagree_rule: str = "clamp"
    """``clamp`` (move only when outside the bucket span of mean..P90) or ``stay``
    (reference: never move when mean and P90 disagree)."""

    max_queue_length: int = 3
    """Trajectories an instance of the predicted bucket may hold before a new trajectory
    goes by load instead (reference 48-GPU Qwen3-14B config: 3; 0 = no such preference).
    The bucket's ``max_trajectories_per_instance`` stays the hard cap."""

    enable_fallback: bool = True
    """Route to the nearest other bucket when the wanted one has no room (reference true)."""

    def __post_init__(self) -> None:
        for field_name in ("recent_window_trajectories", "p90_window_samples", "min_node_visits"):
            if getattr(self, field_name) <= 0:
                raise ValueError(f"{field_name} must be positive, got {getattr(self, field_name)}")
        if self.entry not in ENTRY_RULES:
            raise ValueError(f"entry must be one of {ENTRY_RULES}, got {self.entry!r}")
        if self.disagree_rule not in DISAGREE_RULES:
            raise ValueError(
                f"disagree_rule must be one of {DISAGREE_RULES}, got {self.disagree_rule!r}"
            )
        for field_name in (
            "rebuild_interval_steps",
            "tree_persist_interval_finishes",
            "max_queue_length",
        ):
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
        self._static_thresholds = self._init_thresholds(layout, config)
        # Live GPUs per bucket as last seen by a placement (placements read the loads
        # anyway; a stay decision must not have to).
        self._shares = live_gpu_shares(layout, ())
        self._shares_index: LoadIndex | None = None
        """The load index ``_shares`` was counted from: its live buckets are fixed when it
        is built, so the next placement over the same index need not count again."""
        self._threshold_cache: tuple[tuple, tuple[tuple[str, ...], tuple[float, ...]]] | None = None
        self._tree_epoch = 0
        self._decision_lengths: collections.deque[float] = collections.deque(
            maxlen=LENGTH_WINDOW_SAMPLES
        )
        # The same lengths kept sorted: the thresholds re-sort them after every finish,
        # which is linear on a sorted list instead of n log n.
        self._sorted_lengths: list[float] = []
        self._num_lengths = 0
        self._tree = CausalPrefixTree(config.p90_window_samples)
        self._finishes_since_persist = 0
        self._has_snapshot = False
        # Sequence number of the last trajectory learned from. Ring entries and snapshots
        # carry it so ``restore`` can replay exactly what a snapshot is missing.
        self._learn_seq = 0

    @staticmethod
    def _init_thresholds(layout: BucketLayout, config: CmlfqConfig) -> tuple[float, ...]:
        given = config.bucket_thresholds_tokens
        if given is not None and len(given) != len(layout):
            raise ValueError(
                f"bucket_thresholds_tokens needs {len(layout)} entries (one per bucket), got "
                f"{len(given)}"
            )
        values = given if given is not None else [bucket.max_tokens for bucket in layout.buckets]
        # The longest bucket is unbounded above: no length is left without a bucket.
        return (*(float(v) for v in values[:-1]), math.inf)

    def thresholds(self) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """Bucket names (short first) and the upper thresholds in force now."""
        if not self._config.live_thresholds or self._config.bucket_thresholds_tokens is not None:
            return self._layout.names, self._static_thresholds
        key = (tuple(self._shares.items()), self._num_lengths, self._tree_epoch)
        if self._threshold_cache is None or self._threshold_cache[0] != key:
            derived = live_thresholds(
                self._layout, self._shares, self._sorted_lengths, self._config.min_node_visits
            )
            self._threshold_cache = (key, derived)
        return self._threshold_cache[1]

    def bucket_span(self, node: PrefixTreeNode) -> tuple[str, str]:
        """Buckets of the node's mean and P90 under ``thresholds``, shorter first."""
        names, thresholds = self.thresholds()
        if len(names) == 1:  # one live bucket: every length maps to it (a uniform layout)
            return names[0], names[0]
        mean_index = bucket_index_for_length(thresholds, node.mean_tokens)
        p90_index = bucket_index_for_length(thresholds, node.p90_tokens)
        return names[min(mean_index, p90_index)], names[max(mean_index, p90_index)]

    def evidence(
        self, prompt_id: str, path_keys: list[str] | tuple[str, ...]
    ) -> PrefixTreeNode | None:
        """The node to trust for this path: the deeper of the prompt's and the global
        root's deepest matches that has ``min_node_visits`` visits (prompt first on a tie)."""
        best: PrefixTreeNode | None = None
        for root in (prompt_id, None):
            node = self._tree.deepest(root, path_keys)
            if node is None or node.visit_count < self._config.min_node_visits:
                continue
            if best is None or node.depth > best.depth:
                best = node
        return best

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
            self._tree_epoch += 1
            snapshot_seq = snapshot.get("learn_seq")
            if snapshot_seq is not None:
                self._learn_seq = max(self._learn_seq, int(snapshot_seq))
            for data in recent:
                entry = RecentTrajectory.from_dict(data)
                if snapshot_seq is not None and int(data.get("seq", 0)) > snapshot_seq:
                    self._insert(entry)  # learned after the snapshot
                else:
                    self._remember_lengths(entry)  # in the tree already; thresholds need it
            return "snapshot"
        if recent:
            self._rebuild(recent)
            return "ring"
        return "empty"

    def bucket_for_node(self, node: PrefixTreeNode) -> str | None:
        """The agreed bucket of a node: set only when mean and P90 map to the same bucket."""
        low, high = self.bucket_span(node)
        return low if low == high else None

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
        if self._config.entry == "shortest":
            # Reference: new work enters the top (shortest) level whatever its length.
            return self._place_in(
                trajectory, self._layout.shortest.name, Reason.SHORTEST_BUCKET, instances
            )
        loads = resolve_instances(instances)
        if loads is not self._shares_index:
            self._shares = live_gpu_shares(self._layout, loads)
            self._shares_index = loads if isinstance(loads, LoadIndex) else None
        node = self.evidence(trajectory.prompt_id, ())
        target = self.bucket_for_node(node) if node is not None else None
        if target is not None:
            result = route_with_queue_length(
                target, loads, self._layout, self._config.max_queue_length, cursor=self._cursor
            )
            if result is not None:
                return self._placement_from(trajectory, target, Reason.PREDICTED, result)
        # No evidence, no agreement, or the predicted bucket is busy: go by load.
        result = route_by_load(loads, self._layout, cursor=self._cursor)
        if result is not None and target is not None and result.bucket != target:
            result = RouteResult(result.instance_id, result.bucket, RouteKind.FALLBACK)
        return self._placement_from(trajectory, target, Reason.LEAST_LOADED, result)

    def _decide(
        self, record: TrajectoryRecord, tokens_so_far: int, instances: InstanceSource
    ) -> Decision:
        node = self.evidence(record.prompt_id, record.path_keys)
        if node is None:
            return self._stay(record, Reason.UNSEEN)
        low, high = self.bucket_span(node)
        if low == high:
            if low == record.bucket:
                return self._stay(record, Reason.ALREADY_IN_TARGET, low)
            return self._move_to(record, low, Reason.MOVE, instances)
        if self._config.disagree_rule == "stay":
            return self._stay(record, Reason.DISAGREE)
        # Clamp: stay inside the span bucket(mean)..bucket(P90); move to its nearest end.
        level = self._layout.index(record.bucket)
        if level < self._layout.index(low):
            return self._move_to(record, low, Reason.DISAGREE_CLAMP, instances)
        if level > self._layout.index(high):
            return self._move_to(record, high, Reason.DISAGREE_CLAMP, instances)
        return self._stay(record, Reason.DISAGREE)

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
        self._tree.rebuild(())
        self._decision_lengths.clear()
        self._sorted_lengths.clear()
        for data in recent:
            self._insert(RecentTrajectory.from_dict(data))
        self._tree_epoch += 1
        self._counters["rebuilds"] += 1

    def _remember_lengths(self, recent: RecentTrajectory) -> None:
        # Lengths as C-MLFQ maps them: the total at entry, the remaining after each return.
        for length in (recent.total_tokens, *recent.remaining_tokens):
            if len(self._decision_lengths) == self._decision_lengths.maxlen:
                oldest = self._decision_lengths[0]  # the deque drops it on append
                del self._sorted_lengths[bisect.bisect_left(self._sorted_lengths, oldest)]
            self._decision_lengths.append(float(length))
            bisect.insort(self._sorted_lengths, float(length))
        self._num_lengths += 1

    def _insert(self, recent: RecentTrajectory) -> None:
        self._remember_lengths(recent)
        self._tree.insert(
            recent.prompt_id, recent.path_keys, recent.remaining_tokens, recent.total_tokens
        )

    def _persist(self) -> None:
        self._store.save_tree({**self._tree.to_dict(), "learn_seq": self._learn_seq})
        self._finishes_since_persist = 0
