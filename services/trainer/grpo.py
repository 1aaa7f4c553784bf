"""Pure GRPO bookkeeping: staleness filter, complete-group batching, advantages.

The trainer core uses these on ``libra.types.Trajectory`` values before anything touches
torch, so each rule is unit-testable without a model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from libra import types as t
from libra.training.samples import TrainSample

ZERO_STD = 1e-6


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """(r - mean) / (std + 1e-6) within one group; 0 when the group has no variance."""
    n = len(rewards)
    if n == 1:
        return [float(rewards[0])]  # a singleton keeps its raw reward
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    if std < ZERO_STD:
        return [0.0] * n
    return [(r - mean) / (std + ZERO_STD) for r in rewards]


def staleness(current_version: int, traj: t.Trajectory) -> int:
    """Versions between the trainer's policy and the trajectory's oldest model token."""
    oldest = traj.min_version
    return 0 if oldest < 0 else current_version - oldest


@dataclass
class GroupBuffer:
    """Collects trajectories by group until each group is complete.

    GRPO needs whole groups: when one member must be dropped (too stale, failed), the
    group is broken and every member, present or still to come, is dropped with it.
    """

    group_size: int
    groups: dict[str, list[tuple[str, t.Trajectory]]] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)

    def add(self, entry_id: str, traj: t.Trajectory) -> list[tuple[str, t.Trajectory, str]]:
        """Keep a member; returns it as dropped (with the reason) if its group is broken."""
        if traj.group_id in self.broken:
            return [(entry_id, traj, self.broken[traj.group_id])]
        members = self.groups.setdefault(traj.group_id, [])
        if all(m.trajectory_id != traj.trajectory_id for _, m in members):
            members.append((entry_id, traj))
        return []

    def break_group(self, group_id: str, reason: str) -> list[tuple[str, t.Trajectory, str]]:
        """Mark a group broken; returns the members held so far, to drop."""
        self.broken.setdefault(group_id, reason)
        return [(e, tr, self.broken[group_id]) for e, tr in self.groups.pop(group_id, [])]

    def complete(self) -> list[str]:
        return [g for g, members in self.groups.items() if len(members) >= self.group_size]

    def take(self, group_ids: Iterable[str]) -> list[tuple[str, t.Trajectory]]:
        out: list[tuple[str, t.Trajectory]] = []
        for gid in group_ids:
            out.extend(self.groups.pop(gid))
        return out


def to_samples(trajs: list[t.Trajectory]) -> list[TrainSample]:
    """Training samples of a batch, each with its advantage within its group.

    A trajectory with earlier segments (an external agent that rewrote its history)
    gives one sample per sequence, segments first, all with the trajectory's advantage:
    the advantage is computed over trajectories (the group's episodes), so a split
    episode weighs in its group's statistics once, like AReaL's split sequences."""
    by_group: dict[str, list[t.Trajectory]] = {}
    for tr in trajs:
        by_group.setdefault(tr.group_id, []).append(tr)
    samples = []
    for group in by_group.values():
        for tr, adv in zip(group, group_advantages([tr.reward for tr in group]), strict=True):
            samples.extend(TrainSample(token_ids=seq.token_ids, loss_mask=seq.loss_mask,
                                       rollout_logprobs=seq.logprobs, advantage=adv,
                                       group_id=tr.group_id, trajectory_id=tr.trajectory_id)
                           for seq in (*tr.segments, tr))
    return samples
