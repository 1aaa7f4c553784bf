"""The training side of the simulated RL loop: one step at a time, timed by the cost model."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from libra.errors import InvalidArgument
from scheduling.planner import HardwareSpec, ModelSpec, TrainParallelism, train_step_s
from scheduling.staleness import bounded_batch


class SimTrainer:
    """Trains steps in order on the core group plus the replicas lent by the pool.

    Args:
        hw: Device.
        model: Model.
        num_gpus: All devices (a synchronous loop trains on all of them).
        gpus_per_node: Devices per node (a lent node adds this many to data parallelism).
        colocated: Synchronous colocated loop (TP8 replicas over every device).
        token_scale: Each batch trains as this many times its tokens (the planner
            twin's slice of a large fleet, ``sim.twin_slice``: a 1/k sample of the
            work trains as the whole step on the whole training group).
    """

    def __init__(
        self, hw: HardwareSpec, model: ModelSpec, num_gpus: int, gpus_per_node: int,
        colocated: bool, token_scale: float = 1.0,
    ) -> None:
        self._hw, self._model = hw, model
        self._token_scale = token_scale
        self._num_gpus, self._gpus_per_node, self._colocated = num_gpus, gpus_per_node, colocated
        self.version = 0
        """Steps trained (the policy version rollouts are generated with)."""
        self.busy = False
        self.busy_gpu_s = 0.0
        self.log: list[dict[str, Any]] = []
        self._last_complete_s = 0.0

    def group(self, base: TrainParallelism, lent_nodes: int) -> TrainParallelism:
        """Parallelism of the next step: the core plan widened by the lent nodes."""
        if self._colocated:
            return TrainParallelism(8, 1, self._num_gpus // 8)
        extra = lent_nodes * self._gpus_per_node // (base.tp * base.pp)
        return TrainParallelism(base.tp, base.pp, base.dp + extra, base.micro_batch)

    def start(
        self, step: int, tokens: list[int], base: TrainParallelism, lent_nodes: int, now: float
    ) -> float:
        """Begin training ``step`` (its trajectories' token counts); return its duration.

        ``rollout_s`` in the log is the gap since the previous step's rollouts completed.
        """
        self.busy = True
        par = self.group(base, lent_nodes)
        total = sum(tokens)
        mean = total / len(tokens)
        if self._token_scale != 1.0:
            total *= self._token_scale
        train_s = train_step_s(self._hw, self._model, par, total, mean)
        self.busy_gpu_s += train_s * par.num_gpus
        self.log.append({
            "step": step, "start_s": now, "train_s": train_s,
            "rollout_s": now - self._last_complete_s, "train_gpus": par.num_gpus,
            "trajectories": len(tokens),
        })
        self._last_complete_s = now
        return train_s

    def done(self) -> None:
        """The step in progress ended: the version advances."""
        self.busy = False
        self.version += 1


CONSUMPTION_MODES = ("barrier", "stream", "bounded")
CONSUME_UNITS = ("group", "trajectory")
"""What a streaming trainer takes as one unit: a whole GRPO group, ready when its last
member finishes (the reference, AReaL, our trainer), or each trajectory on its own."""


def check_consume_unit(unit: object) -> str:
    """``unit`` if it is a consumption unit, else ``InvalidArgument`` naming the field."""
    if unit not in CONSUME_UNITS:
        raise InvalidArgument(
            "consume_unit", f"must be one of {', '.join(CONSUME_UNITS)}, got {unit!r}"
        )
    return str(unit)


class BatchSource:
    """Which finished trajectories the next training step consumes (issue 20 item 3).

    ``barrier`` (the reference, verl, slime): step s trains on step s's trajectories
    once all of them have finished. ``stream`` (AReaL, verl fully-async): a step trains
    on the first units to finish, as many as step s has, whichever step released them;
    a straggler is consumed by a later step, its staleness (trainer version at
    consumption minus the version its step was released at) recorded. ``bounded``:
    streaming under a per-unit staleness bound (``scheduling.staleness``).

    The unit (``consume_unit``): GRPO normalises advantages within a prompt's group, so
    the reference (``_collect_complete_grpo_batch``), AReaL (``GroupedRolloutWorkflow``
    gathers a prompt's samples before it yields the episode) and our trainer
    (``services/trainer/batch_collector.py``) train only complete groups. A group is
    ready when its last member finishes; its version is its oldest member's (the live
    trainer drops a group when any member is stale). Under the barrier every step's
    groups are complete, so the unit changes nothing there.

    Args:
        mode: ``barrier``, ``stream`` or ``bounded``.
        by_step: Trajectories of each step (their count is the batch size).
        unit: ``group`` (members share ``rec.group_id`` within a step) or ``trajectory``.

    Raises:
        ValueError: Unknown mode.
        InvalidArgument: Unknown unit (field ``consume_unit``).
    """

    def __init__(self, mode: str, by_step: dict[int, list[Any]], unit: str = "group") -> None:
        if mode not in CONSUMPTION_MODES:
            raise ValueError(
                f"consumption must be one of {', '.join(CONSUMPTION_MODES)}, got {mode!r}"
            )
        self._mode, self._by_step = mode, by_step
        self._unit = check_consume_unit(unit)
        self._done: dict[int, int] = {}
        self._members = Counter(self._key(t) for ts in by_step.values() for t in ts)
        self._units_per_step = {
            s: len({self._key(t) for t in ts}) for s, ts in by_step.items()
        }
        self._held: dict[tuple[int, str], list[Any]] = {}
        """Finished members of units not yet complete."""
        self._ready: list[list[Any]] = []
        """Complete units, in the order their last member finished."""
        self._ready_versions: list[int] = []
        """Per ready unit, its version (its oldest member's; fixed once finished)."""
        self._held_versions: Counter[int] = Counter()
        """Oldest-token versions of the held members, counted (no zero entries): the
        staleness check needs only which versions are held, not every member (at 1,000
        GPUs thousands are held and ``take`` runs at every finish)."""
        self.released_version: dict[int, int] = {}
        self.consumed = 0
        """Trajectories handed to training so far."""
        self.staleness: list[int] = []
        """Per consumed trajectory: versions between its step's release and its use."""

    def _key(self, traj: Any) -> tuple[int, str]:
        rec = traj.rec
        return (rec.step, rec.group_id if self._unit == "group" else rec.trajectory_id)

    def on_release(self, step: int, version: int) -> None:
        """Step ``step`` was released at trainer ``version``."""
        self.released_version[step] = version

    def on_finish(self, traj: Any) -> bool:
        """A trajectory finished; True when its step is now complete."""
        step = traj.rec.step
        self._done[step] = self._done.get(step, 0) + 1
        key = self._key(traj)
        members = self._held.setdefault(key, [])
        members.append(traj)
        self._held_versions[traj.first_version] += 1
        if len(members) == self._members[key]:
            unit = self._held.pop(key)
            for t in unit:
                self._unhold(t.first_version)
            self._ready.append(unit)
            self._ready_versions.append(min(t.first_version for t in unit))
        return self._done[step] == len(self._by_step[step])

    def take(
        self, step: int, complete: bool, version: int, *, in_flight: Any = (),
        max_staleness: int = 0, last: bool = False,
    ) -> list[Any] | None:
        """The batch of training step ``step`` if it can start (``complete``: all of
        step ``step``'s trajectories finished), else ``None``. ``bounded`` also takes
        the oldest-token versions ``in_flight``, the bound and ``last`` (nothing more
        will finish)."""
        if self._mode == "barrier":
            if not complete:
                return None
            batch = self._by_step[step]
            ids = {id(t) for t in batch}
            self._keep_ready([i for i, u in enumerate(self._ready) if id(u[0]) not in ids])
            return self._consumed(batch, version, by_release=True)
        size = self._units_per_step[step]
        if self._mode == "stream":
            if len(self._ready) < size:
                return None
            units = self._ready[:size]
            self._keep_ready(range(size, len(self._ready)))
            return self._consumed([t for u in units for t in u], version, by_release=True)
        if not last and len(self._ready) < size:
            # ``bounded_batch`` would wait too (its only other outcome, a ready unit
            # past the bound, is a broken invariant): skip its scan of every version.
            return None
        # A unit's version is its oldest member's; an incomplete unit counts as in
        # flight at the oldest version among its members, finished or not (the held
        # versions, each once: the rule asks only whether any is due).
        picked = bounded_batch(
            self._ready_versions, itertools.chain(in_flight, self._held_versions),
            version, size, max_staleness, last=last,
        )
        if picked is None:
            return None
        chosen = set(picked)
        batch = [t for i in picked for t in self._ready[i]]
        self._keep_ready([i for i in range(len(self._ready)) if i not in chosen])
        return self._consumed(batch, version, by_release=False)

    def _unhold(self, version: int) -> None:
        self._held_versions[version] -= 1
        if not self._held_versions[version]:
            del self._held_versions[version]

    def _keep_ready(self, kept: Any) -> None:
        """Keep the ready units at indices ``kept`` (ascending), with their versions."""
        self._ready = [self._ready[i] for i in kept]
        self._ready_versions = [self._ready_versions[i] for i in kept]

    def _consumed(self, batch: list[Any], version: int, *, by_release: bool) -> list[Any]:
        """Count ``batch`` as trained at ``version``; staleness from its step's release
        (barrier, stream) or its oldest token (bounded)."""
        if by_release:
            self.staleness += [version - self.released_version[t.rec.step] for t in batch]
        else:
            self.staleness += [version - t.first_version for t in batch]
        self.consumed += len(batch)
        return batch
