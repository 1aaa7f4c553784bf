"""Training sample types; pure, so the trainer core and the rollout side can share them.

A :class:`TrainSample` is one finished trajectory flattened into a token sequence, ready
for the backend's PPO step.
"""

from __future__ import annotations

from dataclasses import dataclass

from libra.types import GroupId, TrajectoryId


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSample:
    """One trajectory as the trainer consumes it.

    Attributes:
        token_ids: Prompt (with ``<bos>``), then every turn and tool output, in order.
        loss_mask: 1 on tokens the policy generated, 0 on prompt and tool-output tokens.
        rollout_logprobs: Behaviour log-prob of each token as reported by the engine,
            aligned with ``token_ids`` (0 where the mask is 0).
        advantage: Group-relative advantage of the whole trajectory.
        group_id: Group of samples of the same prompt.
        trajectory_id: Id of the trajectory, for logs and metrics.
    """

    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    advantage: float
    group_id: GroupId
    trajectory_id: TrajectoryId

    def __post_init__(self) -> None:
        lengths = {len(self.token_ids), len(self.loss_mask), len(self.rollout_logprobs)}
        if len(lengths) != 1:
            raise ValueError(
                f"trajectory_id={self.trajectory_id}: token_ids, loss_mask and "
                f"rollout_logprobs lengths differ: {sorted(lengths)}"
            )
        if self.loss_mask and self.loss_mask[0]:
            raise ValueError(f"trajectory_id={self.trajectory_id}: first token cannot be trained")


@dataclass(frozen=True, kw_only=True, slots=True)
class SftExample:
    """One supervised demonstration: tokens and a mask of the tokens to imitate."""

    token_ids: list[int]
    loss_mask: list[int]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.loss_mask):
            raise ValueError("token_ids and loss_mask lengths differ")
