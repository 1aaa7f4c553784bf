"""Baseline ``la_mlfq``: length-aware MLFQ with a history table and GRPO scouts.

Placement, in order (design digest section 4):

1. **History**: a prompt whose last trajectory finished within ``history_ttl_steps``
   goes to that trajectory's final bucket.
2. **Scout**: the first sample of a GRPO group goes to the short bucket; its siblings
   wait (``begin`` returns an unplaced ``WAIT_FOR_SCOUT``; the caller keeps them
   queued) until the scout's bucket is known (it finished, or was demoted), then
   follow it. After ``scout_timeout_s`` without news they route by input length.
3. **Input length**: at most ``short_threshold_tokens`` -> short bucket, else the
   longest bucket.

Its signal is length, the "fragile length prediction" C-MLFQ replaces. Demotion
(generated tokens past the bucket's ``max_tokens`` -> longest bucket) exists in the
reference but is not called at runtime there, so it is off by default here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libra.clock import Clock, SystemClock
from libra.types import TrajectoryId
from scheduling.policy.base import (
    Decision,
    InstanceSource,
    Placement,
    Reason,
    Release,
    TrajectoryDescriptor,
)
from scheduling.policy.layout import BucketLayout
from scheduling.policy.pinning import PinningPolicy
from scheduling.policy.store import PolicyStore, TrajectoryRecord

HISTORY_NAMESPACE = "la_mlfq:history"
SCOUT_NAMESPACE = "la_mlfq:scout"
META_NAMESPACE = "la_mlfq:meta"
_STEP_KEY = "step"


@dataclass(frozen=True, kw_only=True, slots=True)
class LaMlfqConfig:
    """``la_mlfq`` knobs. Defaults are the reference code's."""

    history_ttl_steps: int = 5
    """A history entry written at step s is used up to step s + this (reference 5)."""

    scout_timeout_s: float = 30.0
    """Siblings stop waiting for their scout after this long (reference 30 s)."""

    short_threshold_tokens: int | None = None
    """Input length up to which a trajectory goes to the short bucket; ``None`` uses the
    shortest bucket's ``max_tokens``."""

    enable_demotion: bool = False
    """Demote to the longest bucket once generated tokens exceed the bucket's
    ``max_tokens`` (reference: implemented but not called at runtime)."""

    enable_fallback: bool = True
    """Route to the nearest other bucket when the wanted one has no room."""

    def __post_init__(self) -> None:
        if self.history_ttl_steps < 0:
            raise ValueError(f"history_ttl_steps must be >= 0, got {self.history_ttl_steps}")
        if self.scout_timeout_s < 0:
            raise ValueError(f"scout_timeout_s must be >= 0, got {self.scout_timeout_s}")
        if self.short_threshold_tokens is not None and self.short_threshold_tokens <= 0:
            raise ValueError(
                f"short_threshold_tokens must be positive, got {self.short_threshold_tokens}"
            )


class LaMlfqPolicy(PinningPolicy):
    """History + scout + input-length placement.

    Args:
        layout: Bucket layout.
        store: Policy state (history table, scouts and the current step live here so
            scheduler replicas share them).
        config: Knobs.
        clock: Time source for the scout timeout (wall clock: replicas compare it).
    """

    name = "la_mlfq"

    def __init__(
        self,
        layout: BucketLayout,
        store: PolicyStore,
        config: LaMlfqConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        config = config or LaMlfqConfig()
        super().__init__(layout, store, enable_fallback=config.enable_fallback)
        self._config = config
        self._clock = clock or SystemClock()
        self._short_threshold_tokens = config.short_threshold_tokens or layout.shortest.max_tokens

    def abort(self, trajectory_id: TrajectoryId) -> Release:
        """Release; an aborted scout is forgotten so the next sibling becomes the scout."""
        data = self._store.get_trajectory(trajectory_id)
        release = super().abort(trajectory_id)
        if data is not None and data["group_id"]:
            scout = self._store.get_record(SCOUT_NAMESPACE, data["group_id"])
            if scout is not None and scout["scout_id"] == trajectory_id and scout["bucket"] is None:
                self._store.delete_record(SCOUT_NAMESPACE, data["group_id"])
        return release

    def on_step_end(self, step: int) -> None:
        """Advance the step and prune history and scout entries older than the TTL."""
        self._store.put_record(META_NAMESPACE, _STEP_KEY, {"step": step})
        for namespace in (HISTORY_NAMESPACE, SCOUT_NAMESPACE):
            for key, entry in self._store.list_records(namespace).items():
                if step - entry["step"] > self._config.history_ttl_steps:
                    self._store.delete_record(namespace, key)

    def _current_step(self) -> int:
        entry = self._store.get_record(META_NAMESPACE, _STEP_KEY)
        return 0 if entry is None else int(entry["step"])

    def _place(self, trajectory: TrajectoryDescriptor, instances: InstanceSource) -> Placement:
        history_bucket = self._history_bucket(trajectory.prompt_id)
        if history_bucket is not None:
            return self._place_in(trajectory, history_bucket, Reason.HISTORY, instances)
        if trajectory.group_id:
            placement = self._place_with_scout(trajectory, instances)
            if placement is not None:
                return placement
        return self._place_in(
            trajectory, self._input_length_bucket(trajectory), Reason.INPUT_LENGTH, instances
        )

    def _history_bucket(self, prompt_id: str) -> str | None:
        entry = self._store.get_record(HISTORY_NAMESPACE, prompt_id)
        if entry is None or entry["bucket"] not in self._layout:
            return None
        if self._current_step() - entry["step"] > self._config.history_ttl_steps:
            return None
        return entry["bucket"]

    def _place_with_scout(
        self, trajectory: TrajectoryDescriptor, instances: InstanceSource
    ) -> Placement | None:
        """Scout rule; ``None`` means "scout timed out, use input length"."""
        group_id = str(trajectory.group_id)
        scout = self._store.get_record(SCOUT_NAMESPACE, group_id)
        if scout is None:
            placement = self._place_in(
                trajectory, self._layout.shortest.name, Reason.SCOUT, instances
            )
            if placement.is_placed:
                self._store.put_record(
                    SCOUT_NAMESPACE,
                    group_id,
                    {
                        "scout_id": trajectory.trajectory_id,
                        "started_s": self._clock.now_s(),
                        "bucket": None,
                        "step": self._current_step(),
                    },
                )
            return placement
        if scout["bucket"] is not None and scout["bucket"] in self._layout:
            return self._place_in(trajectory, scout["bucket"], Reason.FOLLOW_SCOUT, instances)
        if self._clock.now_s() - scout["started_s"] < self._config.scout_timeout_s:
            return Placement(trajectory.trajectory_id, None, None, None, Reason.WAIT_FOR_SCOUT)
        return None

    def _input_length_bucket(self, trajectory: TrajectoryDescriptor) -> str:
        if trajectory.input_tokens <= self._short_threshold_tokens:
            return self._layout.shortest.name
        return self._layout.longest.name

    def _decide(
        self, record: TrajectoryRecord, tokens_so_far: int, instances: InstanceSource
    ) -> Decision:
        current = self._layout.get(record.bucket)
        longest = self._layout.longest.name
        if not self._config.enable_demotion or record.bucket == longest:
            return self._stay(record, Reason.STAY)
        if tokens_so_far <= current.max_tokens:
            return self._stay(record, Reason.STAY)
        self._publish_scout_bucket(record, longest)
        return self._move_to(record, longest, Reason.DEMOTION, instances)

    def _learn(self, record: TrajectoryRecord, total_tokens: int) -> None:
        # The final bucket is where demotion would have taken it: never shorter than the
        # bucket it ran in, and long enough for what it actually generated.
        realised_index = self._layout.index(self._layout.bucket_for_length(total_tokens).name)
        final_index = max(self._layout.index(record.bucket), realised_index)
        final_bucket = self._layout.buckets[final_index].name
        self._store.put_record(
            HISTORY_NAMESPACE,
            record.prompt_id,
            {"bucket": final_bucket, "step": self._current_step()},
        )
        self._publish_scout_bucket(record, final_bucket)

    def _publish_scout_bucket(self, record: TrajectoryRecord, bucket: str) -> None:
        if not record.group_id:
            return
        scout: dict[str, Any] | None = self._store.get_record(SCOUT_NAMESPACE, record.group_id)
        if scout is not None and scout["scout_id"] == record.trajectory_id:
            self._store.put_record(SCOUT_NAMESPACE, record.group_id, {**scout, "bucket": bucket})
