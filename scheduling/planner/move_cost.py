"""What a move to another plan costs when it migrates in-flight turns (pure).

The ``migrated`` transition-cost model (``PlannerConfig.transition_cost_model``) predicts
the cost of the simulator's ``migrate`` strategies (``sim/moves.py``) from the same two
terms the simulator charges, in seconds of step time:

- **weight load**: the re-created share of the rollout devices serves nothing while its
  new instances read their weights (model bytes over the smallest TP degree of the
  candidate's layout, at ``weight_load_bw_bytes_per_s``): ``share x load_s``;
- **re-prefill**: the turns on those devices resume elsewhere and prefill their context
  again. In flight on the share: ``in_flight x share`` trajectories; each holds, on
  average, its prompt plus the length-biased half of its output (a trajectory in flight
  is more likely a long one: the mean of ``g^2 / 2`` over the mean of ``g``); the
  prefill work, as device-seconds at TP1, is spread over the candidate's rollout
  devices.

No decoded token is lost under ``migrate``: that term belongs to ``recreated``.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.planner.plan import Plan
from scheduling.planner.roofline import prefill_s
from scheduling.planner.scored import Workload
from scheduling.planner.specs import HardwareSpec, ModelSpec


@dataclass(frozen=True, slots=True)
class MoveCost:
    """A move's predicted cost and its terms, in seconds of step time."""

    share: float
    """Share of the current rollout devices the move re-creates."""
    load_s: float
    reprefill_s: float

    @property
    def total_s(self) -> float:
        """Both terms."""
        return self.load_s + self.reprefill_s


def migrated_move_cost(
    current: Plan, candidate: Plan, work: Workload, hw: HardwareSpec, model: ModelSpec,
    gpus_per_node: int, weight_load_bw_bytes_per_s: float, in_flight: int | None = None,
) -> MoveCost:
    """Predicted cost of moving from ``current`` to ``candidate`` under ``migrate``.

    Args:
        in_flight: Trajectories in flight when the move is decided (``None``: a full
            pipeline, ``requests_per_step x pipeline_depth``).
    """
    share = current.rollout_share_recreated(candidate, gpus_per_node)
    if share <= 0:
        return MoveCost(0.0, 0.0, 0.0)
    load_s = 0.0
    if weight_load_bw_bytes_per_s > 0:
        replica_bytes = model.num_params * model.dtype_bytes / min(candidate.rollout_tps)
        load_s = share * replica_bytes / weight_load_bw_bytes_per_s
    n = (work.requests_per_step * work.pipeline_depth) if in_flight is None else in_flight
    gen = [r.gen_tokens for r in work.history]
    prompt = sum(r.prompt_tokens for r in work.history) / len(work.history)
    half_gen = sum(g * g for g in gen) / (2 * sum(gen)) if sum(gen) else 0.0
    ctx = int(prompt + half_gen)
    device_s = n * share * prefill_s(hw, model, 1, ctx)
    return MoveCost(share, load_s, device_s / max(1, candidate.rollout_gpus))
