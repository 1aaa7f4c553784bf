"""Instance selection: least-loaded under the per-instance cap, round-robin ties.

Every policy calls ``route`` (bucket-preferring) or ``route_any`` (length-blind) to
turn a bucket choice into an instance. Loads come from the caller; routing never
mutates them, it only says where one more trajectory should go. ``None`` means every
candidate is full or dead: the caller keeps the trajectory queued instead of piling an
unbounded queue onto one instance.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from libra.types import InstanceId, InstanceLoad
from scheduling.policy.layout import BucketLayout
from scheduling.policy.load_index import LoadIndex

# Cursor scope used by length-blind routing (one rotation over all instances).
ANY_BUCKET_SCOPE = "*"


class RouteKind(enum.StrEnum):
    """Whether the route landed in the requested bucket or a fallback one."""

    PREFERRED = "preferred"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class RouteResult:
    """Where one more trajectory should go."""

    instance_id: InstanceId
    bucket: str
    kind: RouteKind


class RoundRobinCursor:
    """Rotating tie-breaker, one position per scope (bucket name or ``"*"``).

    The cursor remembers the last instance chosen per scope and, among instances tied
    on load, picks the next id after it in sorted order. Keying by id rather than by
    list position keeps the rotation stable when instances join or leave. It is only a
    tie-breaker, so scheduler replicas may each keep their own without harm.
    """

    def __init__(self, last_by_scope: dict[str, str] | None = None) -> None:
        self._last_by_scope: dict[str, str] = dict(last_by_scope or {})

    def pick(self, scope: str, tied_ids: Sequence[InstanceId]) -> InstanceId:
        """Pick one of ``tied_ids`` (sorted ascending) and advance the cursor."""
        return self.pick_merged(scope, [tied_ids])

    def pick_merged(self, scope: str, groups: Sequence[Sequence[InstanceId]]) -> InstanceId:
        """``pick`` over the union of ``groups`` (each sorted, disjoint) without merging
        them: the least id after the cursor over all groups, else the least id."""
        last = self._last_by_scope.get(scope)
        chosen = min(group[0] for group in groups)
        if last is not None:
            after = [group[i] for group in groups
                     if (i := bisect.bisect_right(group, last)) < len(group)]
            if after:
                chosen = min(after)
        self._last_by_scope[scope] = chosen
        return chosen

    def to_dict(self) -> dict[str, str]:
        """JSON-able snapshot."""
        return dict(self._last_by_scope)


def _has_room(instance: InstanceLoad, cap_by_bucket: dict[str, int]) -> bool:
    cap = cap_by_bucket.get(instance.bucket)
    # Instances of a bucket the layout does not know (a re-plan in flight) are skipped:
    # without a cap they cannot be admitted safely.
    return cap is not None and instance.is_live and instance.active_trajectories < cap


def _pick_least_loaded(
    candidates: Iterable[InstanceLoad], scope: str, cursor: RoundRobinCursor
) -> InstanceLoad | None:
    best_load: int | None = None
    tied: list[InstanceLoad] = []
    for instance in candidates:
        load = instance.active_trajectories
        if best_load is None or load < best_load:
            best_load, tied = load, [instance]
        elif load == best_load:
            tied.append(instance)
    if not tied:
        return None
    if len(tied) == 1:
        return tied[0]
    by_id = {instance.instance_id: instance for instance in tied}
    return by_id[cursor.pick(scope, sorted(by_id))]


def _caps(layout: BucketLayout) -> dict[str, int]:
    return {b.name: b.max_trajectories_per_instance for b in layout.buckets}


def _index_of(instances: Sequence[InstanceLoad], caps: dict[str, int]) -> LoadIndex | None:
    """The ``LoadIndex`` behind ``instances`` if it was built for these caps: routing
    then looks loads up instead of scanning every instance."""
    if isinstance(instances, LoadIndex) and instances.caps == caps:
        return instances
    return None


def _pick_indexed(index: LoadIndex, bucket: str, scope: str, cursor: RoundRobinCursor,
                  below: int = 0) -> InstanceLoad | None:
    """``_pick_least_loaded`` over the eligible instances of ``bucket`` (holding fewer
    than ``below`` when positive), by lookup."""
    least = index.least_load(bucket)
    if least is None or (below > 0 and least >= below):
        return None
    tied = index.ids_at(bucket, least)
    # One candidate leaves the cursor where it was, as the scan does.
    chosen = tied[0] if len(tied) == 1 else cursor.pick(scope, tied)
    return index.get(chosen)


def route(
    bucket: str,
    instances: Sequence[InstanceLoad],
    layout: BucketLayout,
    *,
    cursor: RoundRobinCursor | None = None,
    enable_fallback: bool = True,
) -> RouteResult | None:
    """Choose an instance for one more trajectory, preferring ``bucket``.

    Args:
        bucket: The bucket the policy wants.
        instances: Current loads, as the caller sees them.
        layout: The bucket layout (gives order and per-instance caps).
        cursor: Round-robin tie-breaker; a fresh one if omitted.
        enable_fallback: Try the other buckets, nearest first, when ``bucket`` is full.

    Returns:
        The least-loaded live instance under its bucket's cap, or ``None`` if every
        candidate is full or dead.

    Raises:
        UnknownBucket: If ``bucket`` is not in the layout.
    """
    fallbacks = layout.iter_fallback(bucket) if enable_fallback else iter(())
    cursor = cursor if cursor is not None else RoundRobinCursor()
    caps = _caps(layout)
    index = _index_of(instances, caps)
    eligible: dict[str, list[InstanceLoad]] = {}
    if index is None:
        for instance in instances:
            if _has_room(instance, caps):
                eligible.setdefault(instance.bucket, []).append(instance)
    for name in itertools.chain((bucket,), fallbacks):
        chosen = (_pick_least_loaded(eligible.get(name, ()), name, cursor) if index is None
                  else _pick_indexed(index, name, name, cursor))
        if chosen is not None:
            kind = RouteKind.PREFERRED if name == bucket else RouteKind.FALLBACK
            return RouteResult(chosen.instance_id, name, kind)
    return None


def route_any(
    instances: Sequence[InstanceLoad],
    layout: BucketLayout,
    *,
    cursor: RoundRobinCursor | None = None,
) -> RouteResult | None:
    """Choose the least-loaded live instance under its cap, whatever its bucket.

    Ties rotate over all instances. The result kind is always ``PREFERRED``: a
    length-blind policy has no preference to fall back from.
    """
    cursor = cursor if cursor is not None else RoundRobinCursor()
    caps = _caps(layout)
    index = _index_of(instances, caps)
    if index is not None:
        chosen = _pick_any_indexed(index, layout, cursor)
    else:
        candidates = [instance for instance in instances if _has_room(instance, caps)]
        chosen = _pick_least_loaded(candidates, ANY_BUCKET_SCOPE, cursor)
    if chosen is None:
        return None
    return RouteResult(chosen.instance_id, chosen.bucket, RouteKind.PREFERRED)


def _pick_any_indexed(index: LoadIndex, layout: BucketLayout,
                      cursor: RoundRobinCursor) -> InstanceLoad | None:
    """The least-loaded eligible instance of any bucket, ties rotating over all ids."""
    leasts = [(least, b.name) for b in layout.buckets
              if (least := index.least_load(b.name)) is not None]
    if not leasts:
        return None
    least = min(load for load, _name in leasts)
    groups = [index.ids_at(name, least) for load, name in leasts if load == least]
    if len(groups) == 1 and len(groups[0]) == 1:
        return index.get(groups[0][0])  # one candidate: the cursor stays, as in the scan
    return index.get(cursor.pick_merged(ANY_BUCKET_SCOPE, groups))


def route_with_queue_length(
    bucket: str,
    instances: Sequence[InstanceLoad],
    layout: BucketLayout,
    queue_length: int,
    *,
    cursor: RoundRobinCursor | None = None,
) -> RouteResult | None:
    """The least-loaded live instance of ``bucket`` holding fewer than ``queue_length``
    trajectories (and under the bucket's cap); ``None`` if there is none.

    This is the reference's ``max_queue_length`` test on the preferred bucket: past it,
    the caller sends the trajectory elsewhere instead of queueing it on a busy instance.
    ``queue_length = 0`` keeps only the bucket's cap.
    """
    cursor = cursor if cursor is not None else RoundRobinCursor()
    caps = _caps(layout)
    index = _index_of(instances, caps)
    if index is not None:
        chosen = _pick_indexed(index, bucket, bucket, cursor, below=max(queue_length, 0))
        return None if chosen is None else RouteResult(chosen.instance_id, bucket,
                                                       RouteKind.PREFERRED)
    candidates = [
        instance
        for instance in instances
        if instance.bucket == bucket
        and _has_room(instance, caps)
        and (queue_length <= 0 or instance.active_trajectories < queue_length)
    ]
    chosen = _pick_least_loaded(candidates, bucket, cursor)
    return None if chosen is None else RouteResult(chosen.instance_id, bucket, RouteKind.PREFERRED)


def route_by_load(
    instances: Sequence[InstanceLoad],
    layout: BucketLayout,
    *,
    cursor: RoundRobinCursor | None = None,
) -> RouteResult | None:
    """The live instance under its cap with the fewest trajectories per device (pinned
    trajectories / the bucket's TP degree: a TP4 instance has four devices' worth of
    memory bandwidth and KV). Ties go to the shortest bucket, then rotate within it, so
    an idle cluster still fills the top level first."""
    cursor = cursor if cursor is not None else RoundRobinCursor()
    # One pass, comparing (load per device, level) in order: this runs per placement
    # over every instance, and at 1,000 instances the former five passes were most of
    # a scheduler tick.
    caps = _caps(layout)
    index = _index_of(instances, caps)
    if index is not None:
        return _route_by_load_indexed(index, layout, cursor)
    tp = {b.name: b.tp_degree for b in layout.buckets}
    level_of = {b.name: level for level, b in enumerate(layout.buckets)}
    least, least_level = 0.0, -1
    tied: list[InstanceLoad] = []
    for instance in instances:
        cap = caps.get(instance.bucket)
        load = instance.active_trajectories
        if cap is None or not instance.is_live or load >= cap:
            continue
        per_device = load / tp[instance.bucket]
        level = level_of[instance.bucket]
        if least_level < 0 or per_device < least or (per_device == least
                                                     and level < least_level):
            least, least_level, tied = per_device, level, [instance]
        elif per_device == least and level == least_level:
            tied.append(instance)
    if not tied:
        return None
    name = layout.buckets[least_level].name
    chosen = _pick_least_loaded(tied, name, cursor)
    assert chosen is not None  # tied holds at least one instance of that level
    return RouteResult(chosen.instance_id, name, RouteKind.PREFERRED)


def _route_by_load_indexed(index: LoadIndex, layout: BucketLayout,
                           cursor: RoundRobinCursor) -> RouteResult | None:
    """``route_by_load`` by lookup: each bucket's least load per device, shortest bucket
    on ties, then the round-robin pick among that bucket's least-loaded instances."""
    best: tuple[float, int] | None = None
    for level, b in enumerate(layout.buckets):
        least = index.least_load(b.name)
        if least is not None and (best is None or (least / b.tp_degree, level) < best):
            best = (least / b.tp_degree, level)
    if best is None:
        return None
    name = layout.buckets[best[1]].name
    chosen = _pick_indexed(index, name, name, cursor)
    assert chosen is not None  # the bucket has an eligible instance
    return RouteResult(chosen.instance_id, name, RouteKind.PREFERRED)
