"""The training side of the simulated RL loop: one step at a time, timed by the cost model."""

from __future__ import annotations

from typing import Any

from services.coordinator.planner import HardwareSpec, ModelSpec, TrainParallelism, train_step_s


class SimTrainer:
    """Trains steps in order on the core group plus the replicas lent by the pool.

    Args:
        hw: Device.
        model: Model.
        num_gpus: All devices (a synchronous loop trains on all of them).
        gpus_per_node: Devices per node (a lent node adds this many to data parallelism).
        colocated: Synchronous colocated loop (TP8 replicas over every device).
    """

    def __init__(
        self, hw: HardwareSpec, model: ModelSpec, num_gpus: int, gpus_per_node: int,
        colocated: bool,
    ) -> None:
        self._hw, self._model = hw, model
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
        train_s = train_step_s(self._hw, self._model, par, total, total / len(tokens))
        self.busy_gpu_s += train_s * par.num_gpus
        self.log.append({
            "step": step, "start_s": now, "train_s": train_s,
            "rollout_s": now - self._last_complete_s, "train_gpus": par.num_gpus,
        })
        self._last_complete_s = now
        return train_s

    def done(self) -> None:
        """The step in progress ended: the version advances."""
        self.busy = False
        self.version += 1
