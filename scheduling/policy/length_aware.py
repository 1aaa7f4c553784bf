"""Baseline ``length_aware``: static routing by input length.

A trajectory goes to the first bucket whose threshold covers its prompt length. At
each tool return it is re-routed by its accumulated context (prompt + tokens so far),
as the reference schedules every turn by the current context; it stays on its
instance while the bucket does not change. No learning, no prediction.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.policy.base import (
    Decision,
    InstanceSource,
    Placement,
    Reason,
    TrajectoryDescriptor,
)
from scheduling.policy.layout import (
    BucketLayout,
    bucket_index_for_length,
    validate_thresholds,
)
from scheduling.policy.pinning import PinningPolicy
from scheduling.policy.store import PolicyStore, TrajectoryRecord


@dataclass(frozen=True, kw_only=True, slots=True)
class LengthAwareConfig:
    """``length_aware`` knobs."""

    thresholds_tokens: tuple[int, ...] | None = None
    """Length thresholds, one per bucket, short first; ``None`` uses the layout's
    ``max_tokens``. The reference uses 5,000 / 10,000 / 15,000 / unbounded."""

    reroute_on_tool_return: bool = True
    """Re-route by accumulated context at each tool return (reference: every turn)."""

    enable_fallback: bool = True
    """Route to the nearest other bucket when the wanted one has no room."""

    def __post_init__(self) -> None:
        if self.thresholds_tokens is not None:
            validate_thresholds("thresholds_tokens", self.thresholds_tokens)


class LengthAwarePolicy(PinningPolicy):
    """Static input-length routing.

    Args:
        layout: Bucket layout.
        store: Policy state.
        config: Knobs.

    Raises:
        ValueError: If ``config.thresholds_tokens`` does not have one entry per bucket.
    """

    name = "length_aware"

    def __init__(
        self, layout: BucketLayout, store: PolicyStore, config: LengthAwareConfig | None = None
    ) -> None:
        config = config or LengthAwareConfig()
        super().__init__(layout, store, enable_fallback=config.enable_fallback)
        self._config = config
        thresholds = config.thresholds_tokens or tuple(b.max_tokens for b in layout.buckets)
        if len(thresholds) != len(layout):
            raise ValueError(
                f"thresholds_tokens needs {len(layout)} entries (one per bucket), "
                f"got {len(thresholds)}"
            )
        self._thresholds_tokens = thresholds

    def bucket_for_length(self, length_tokens: int) -> str:
        """The bucket this policy assigns to a context of ``length_tokens``."""
        index = bucket_index_for_length(self._thresholds_tokens, length_tokens)
        return self._layout.buckets[index].name

    def _place(self, trajectory: TrajectoryDescriptor, instances: InstanceSource) -> Placement:
        bucket = self.bucket_for_length(trajectory.input_tokens)
        return self._place_in(trajectory, bucket, Reason.INPUT_LENGTH, instances)

    def _decide(
        self, record: TrajectoryRecord, tokens_so_far: int, instances: InstanceSource
    ) -> Decision:
        if not self._config.reroute_on_tool_return:
            return self._stay(record, Reason.STAY)
        target_bucket = self.bucket_for_length(record.input_tokens + tokens_so_far)
        if target_bucket == record.bucket:
            return self._stay(record, Reason.ALREADY_IN_TARGET, target_bucket)
        return self._move_to(record, target_bucket, Reason.CONTEXT_LENGTH, instances)
