"""Streaming consumption under a per-trajectory staleness bound (pure).

A trajectory's version is the policy version of its *oldest* model token (the live
trainer's ``Trajectory.min_version``); with partial rollout (generation continues
across a weight update, later tokens under the new weights) it is the version its
first turn started under. Training step ``u`` runs at trainer version ``u``; a
trajectory of version ``v`` may be trained at ``u`` only if ``u - v <= max_staleness``.

The rule that keeps the bound without ever dropping finished work: a trajectory left
out of the batch trained at ``u`` is trained at ``u + 1`` at the earliest, so every
trajectory with ``v <= u - max_staleness`` ("due") must be in this batch. The batch
is the oldest ``size`` ready trajectories plus any due ones beyond them; the step
waits while a due trajectory is still generating. The live trainer can apply the
same rule: the scheduler knows each in-flight trajectory's start version.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from libra.errors import InvalidArgument


def due_version(version: int, max_staleness: int) -> int:
    """Newest trajectory version that must be trained at ``version`` (or be stale after)."""
    return version - max_staleness


def bounded_batch(
    ready_versions: Sequence[int],
    in_flight_versions: Iterable[int],
    version: int,
    size: int,
    max_staleness: int,
    *,
    last: bool = False,
) -> list[int] | None:
    """Indices into ``ready_versions`` of the batch trained at ``version``, or ``None``
    (wait: too few ready, or a due trajectory still generating).

    Args:
        ready_versions: Oldest-token version of each finished, untrained trajectory, in
            finishing order (ties keep that order).
        in_flight_versions: Oldest-token versions of started, unfinished trajectories.
        version: Trainer version of the step.
        size: Batch size (trajectories per step).
        max_staleness: The bound, in versions.
        last: Nothing more will finish: train what is ready, however few (``None``
            when nothing is).

    Raises:
        InvalidArgument: ``size`` < 1, ``max_staleness`` < 0, or a ready trajectory that
            is already past the bound (the caller broke the rule earlier).
    """
    if size < 1:
        raise InvalidArgument("size", f"must be >= 1, got {size}")
    if max_staleness < 0:
        raise InvalidArgument("max_staleness", f"must be >= 0, got {max_staleness}")
    due = due_version(version, max_staleness)
    # ``min`` rather than ``any`` over a generator: the same answer at C speed (the
    # simulator asks at every finish, with thousands ready at 1,000 GPUs).
    if min(ready_versions, default=due) < due:
        raise InvalidArgument(
            "ready_versions", f"a trajectory older than version {due} is past the bound"
        )
    if not last and min(in_flight_versions, default=due + 1) <= due:
        return None
    if not ready_versions or (not last and len(ready_versions) < size):
        return None
    order = sorted(range(len(ready_versions)), key=lambda i: ready_versions[i])
    n_due = sum(1 for v in ready_versions if v <= due)
    return order[: max(size, n_due)]
