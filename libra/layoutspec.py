"""``[layout]`` of the job spec: the placement policy, the buckets and C-MLFQ's knobs, with
their validation (``libra.jobspec`` builds and validates the whole spec).

The policy and C-MLFQ rule names are checked against the scheduling policies by the
coordinator at submit (the foundation may not import the algorithms), so only their type
and the numbers are checked here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from libra.errors import InvalidArgument
from libra.types import Bucket

_BUCKET_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def _default_buckets() -> list[Bucket]:
    return [Bucket(name="short", max_tokens=96, max_batch_size=8),
            Bucket(name="long", max_tokens=384, max_batch_size=16)]


@dataclass(frozen=True, kw_only=True)
class CmlfqSpec:
    """``[layout.cmlfq]``: C-MLFQ knobs (used when ``layout.policy = "cmlfq"``).

    Defaults equal ``CmlfqConfig``'s: Libra's rules (entry by prediction, clamp on a
    mean/P90 disagreement, thresholds from the live layout, queue length 3, 10 visits);
    ``entry = "shortest"``, ``disagree_rule = "stay"``, ``live_thresholds = false``,
    ``max_queue_length = 0``, ``min_node_visits = 1`` are the reference's. The hard
    per-instance cap is per bucket: ``max_trajectories_per_instance``.
    """

    rebuild_interval_steps: int = 50
    recent_window_trajectories: int = 5000
    p90_window_samples: int = 200
    tree_persist_interval_finishes: int = 0
    min_node_visits: int = 10
    bucket_thresholds_tokens: list[int] = field(default_factory=list)
    live_thresholds: bool = True
    entry: str = "predict"
    disagree_rule: str = "clamp"
    max_queue_length: int = 3
    enable_fallback: bool = True


@dataclass(frozen=True, kw_only=True)
class LayoutSpec:
    """``[layout]``: the placement policy, the buckets (shortest first) and C-MLFQ's knobs."""

    policy: str = "least_loaded"
    buckets: list[Bucket] = field(default_factory=_default_buckets)
    cmlfq: CmlfqSpec = field(default_factory=CmlfqSpec)

    def bucket(self, name: str) -> Bucket | None:
        """The bucket called ``name``; None when the layout has none of that name."""
        return next((b for b in self.buckets if b.name == name), None)


def _require(ok: bool, path: str, reason: str) -> None:
    if not ok:
        raise InvalidArgument(path, reason)


def validate_layout(layout: LayoutSpec) -> None:
    """``[layout]``'s ranges and cross-field rules; raises InvalidArgument naming the field."""
    _require(bool(layout.policy.strip()), "layout.policy",
             "must name a placement policy (which ones: the scheduler's registry)")
    _require(len(layout.buckets) >= 1, "layout.buckets", "at least one bucket is required")
    names = [b.name for b in layout.buckets]
    for i, name in enumerate(names):
        _require(bool(_BUCKET_NAME.fullmatch(name)), f"layout.buckets[{i}].name",
                 f"{name!r} is not a bucket name (1-32 of a-z, 0-9, '_', '-', starting "
                 "with a letter); rollout instances name their bucket the same way")
    _require(len(set(names)) == len(names), "layout.buckets", "bucket names must be unique")
    limits = [b.max_tokens for b in layout.buckets]
    _require(limits == sorted(limits) and len(set(limits)) == len(limits),
             "layout.buckets", f"max_tokens must be strictly increasing (shortest bucket "
             f"first), got {limits}")
    for i, b in enumerate(layout.buckets):
        for name in ("max_tokens", "tp_degree", "max_batch_size",
                     "max_trajectories_per_instance"):
            _require(getattr(b, name) >= 1, f"layout.buckets[{i}].{name}", "must be >= 1")
    _validate_cmlfq(layout)


def _validate_cmlfq(layout: LayoutSpec) -> None:
    c = layout.cmlfq
    for name in ("recent_window_trajectories", "p90_window_samples", "min_node_visits"):
        _require(getattr(c, name) >= 1, f"layout.cmlfq.{name}", "must be >= 1")
    for name in ("rebuild_interval_steps", "tree_persist_interval_finishes", "max_queue_length"):
        _require(getattr(c, name) >= 0, f"layout.cmlfq.{name}", "must be >= 0 (0 = never/off)")
    # entry and disagree_rule: the rule names are the policy's (scheduling/policy/
    # cmlfq.py); the coordinator checks them at submit (scheduling.policy.check_layout).
    thresholds = c.bucket_thresholds_tokens
    if thresholds:
        _require(len(thresholds) == len(layout.buckets), "layout.cmlfq.bucket_thresholds_tokens",
                 f"needs one entry per bucket ({len(layout.buckets)}), got {len(thresholds)}")
        increasing = all(a < b for a, b in zip(thresholds, thresholds[1:], strict=False))
        _require(thresholds[0] >= 1 and increasing,
                 "layout.cmlfq.bucket_thresholds_tokens",
                 f"must be positive and strictly increasing, got {thresholds}")
