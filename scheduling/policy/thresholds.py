"""Bucket thresholds derived from the live layout, and the idle-while-queued check.

C-MLFQ maps a predicted remaining length to a bucket through one threshold per bucket.
Fixed thresholds (each bucket's ``max_tokens``) can leave a bucket that no prediction
ever reaches: a TP8 bucket whose range starts above the workload's longest trajectory
idles for the whole run (issue 20). So the thresholds come from the buckets that have a
live instance, and every one of them is reachable:

- only buckets with at least one live instance take part (a bucket without one would
  only send work to a fallback);
- with evidence (``min_samples`` recent lengths as C-MLFQ maps them: totals at entry,
  remaining lengths after each tool return), thresholds split the *tokens* of those
  lengths in proportion to each live bucket's share of the live GPUs: the short bucket
  takes the shortest until it holds its share of the tokens, and so on. Tokens, not
  counts, because work grows with length;
- without evidence, the layout's ``max_tokens`` of the live buckets;
- the longest live bucket is unbounded above (``math.inf``): nothing longer than
  every threshold is left without a bucket.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from libra.types import InstanceId, InstanceLoad
from scheduling.policy.layout import BucketLayout
from scheduling.policy.load_index import LoadIndex


def live_gpu_shares(layout: BucketLayout, instances: Sequence[InstanceLoad]) -> dict[str, int]:
    """Live GPUs per bucket (count of live instances x the bucket's TP degree), short first.

    Buckets with no live instance are left out; if no bucket has one, every bucket counts
    once (nothing is live yet, so no bucket can be preferred).
    """
    counts = dict.fromkeys((bucket.name for bucket in layout.buckets), 0)
    if isinstance(instances, LoadIndex):  # counted when the snapshot was indexed
        for name in counts:
            counts[name] = instances.live_by_bucket.get(name, 0)
    else:
        for instance in instances:  # per placement over every instance: one lookup each
            if instance.is_live and instance.bucket in counts:
                counts[instance.bucket] += 1
    counts = {name: count for name, count in counts.items() if count}
    if not counts:
        return {bucket.name: bucket.tp_degree for bucket in layout.buckets}
    return {
        bucket.name: counts[bucket.name] * bucket.tp_degree
        for bucket in layout.buckets
        if bucket.name in counts
    }


def live_thresholds(
    layout: BucketLayout,
    shares: dict[str, int],
    lengths_tokens: Sequence[float],
    min_samples: int,
) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """Bucket names (short first) and their upper thresholds; the last is ``math.inf``.

    Args:
        layout: The bucket layout (order and fallback ``max_tokens``).
        shares: ``live_gpu_shares`` output.
        lengths_tokens: Recent trajectory lengths (the evidence).
        min_samples: Fewer lengths than this use the layout's ``max_tokens``.
    """
    names = tuple(shares)
    if len(lengths_tokens) < max(1, min_samples) or len(names) == 1:
        bounds = [float(layout.get(name).max_tokens) for name in names[:-1]]
        return names, (*_increasing(bounds), math.inf)
    ordered = sorted(lengths_tokens)  # linear on the sorted window C-MLFQ keeps
    total_tokens = sum(ordered) or 1.0
    total_share = sum(shares.values())
    # Running token sums, added in the same order as a loop over ``ordered`` would.
    cum_tokens = list(itertools.accumulate(ordered, initial=0.0))[1:]
    last = len(ordered) - 1
    bounds, cum_share, i = [], 0.0, 0
    for name in names[:-1]:
        cum_share += shares[name] / total_share
        # Smallest length at which the shortest trajectories hold this bucket's share:
        # the first index whose running sum reaches it (the sums never decrease).
        i = bisect.bisect_left(cum_tokens, cum_share, i, last, key=lambda c: c / total_tokens)
        bounds.append(float(ordered[i]))
    return names, (*_increasing(bounds), math.inf)


def _increasing(bounds: list[float]) -> list[float]:
    """Make thresholds strictly increasing so that no bucket's range is empty."""
    out: list[float] = []
    for value in bounds:
        out.append(value if not out or value > out[-1] else out[-1] + 1.0)
    return out


def idle_while_queued(
    instances: Sequence[InstanceLoad], queued_trajectories: int
) -> tuple[InstanceId, ...]:
    """Live instances with nothing pinned while trajectories wait for a place.

    A healthy placement never leaves one: the caller (the scheduler after a placement
    pass, the simulator) reports what this returns as a fault of the policy or its caps.
    """
    if queued_trajectories <= 0:
        return ()
    if isinstance(instances, LoadIndex):  # checked every tick: no scan of every instance
        return tuple(instances.idle_ids())
    return tuple(sorted(
        instance.instance_id
        for instance in instances
        if instance.is_live and instance.active_trajectories == 0
    ))
