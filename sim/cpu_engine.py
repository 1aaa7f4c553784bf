"""Step costs of a CPU rollout instance (``TorchEngine``), fitted to its in-run calls.

``TorchEngine.generate`` is turn-batched: one call left-pads the batch's contexts, runs
one prefill forward over ``B x L`` tokens, then one decode forward per step until the
longest turn ends (finished rows keep decoding padding). The model:

    prefill_s(B, L)         = p0 + p1 * B * L
    decode_step_s(B, c)     = d0 + d1 * B + d2 * B * c    (one token for B rows, context c)

The coefficients are a least-squares fit to the calls the instance itself timed during
the run (``EngineCall``: batch, padded length, decode steps, wall time; reported in
``GetInstanceStatus.engine_profile_json``). They therefore measure the instance's speed
*under the run's real contention*: the other processes on the machine's cores and, inside
the rollout process, the event loop (tool calls, RPCs) competing with the engine thread
for the GIL. No constant here is chosen by hand.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class CpuEngineCosts:
    """Measured step costs of one CPU rollout instance (seconds)."""

    prefill_base_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_row_s: float
    decode_per_row_ctx_s: float

    def prefill_s(self, batch: int, padded_len: int) -> float:
        """One prefill forward over ``batch`` rows left-padded to ``padded_len``."""
        return self.prefill_base_s + self.prefill_per_token_s * batch * padded_len

    def decode_steps_s(self, batch: int, ctx_start: int, num_steps: int) -> float:
        """``num_steps`` decode forwards for ``batch`` rows from context ``ctx_start``."""
        if num_steps <= 0:
            return 0.0
        per_step = self.decode_base_s + self.decode_per_row_s * batch
        return num_steps * per_step + self.decode_per_row_ctx_s * batch * _ctx_sum(
            ctx_start, num_steps)

    def call_s(self, prompt_lens: list[int], output_lens: list[int]) -> float:
        """One ``generate`` call: prefill, then decode until the longest turn ends."""
        batch, padded = len(prompt_lens), max(prompt_lens)
        return self.prefill_s(batch, padded) + self.decode_steps_s(
            batch, padded, max(output_lens) - 1)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _ctx_sum(ctx_start: int, num_steps: int) -> float:
    return num_steps * ctx_start + num_steps * (num_steps - 1) / 2.0


def fit(calls: list[dict[str, Any]]) -> CpuEngineCosts:
    """Non-negative least-squares fit of the cost model to timed calls.

    Each call: ``batch``, ``prompt_len`` (padded), ``decode_steps`` and ``wall_s`` (the
    fields of ``EngineCall``). Exact NNLS over the five coefficients (every subset of
    columns is solved; the best all-non-negative solution wins): a negative cost is
    noise, not physics, and a solution with an intercept keeps the total time exact.
    """
    x = np.array([_features(c) for c in calls], dtype=float)
    y = np.array([c["wall_s"] for c in calls], dtype=float)
    best: tuple[float, np.ndarray] | None = None
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if (coef < 0).any():
                continue
            resid = float(((x[:, cols] @ coef - y) ** 2).sum())
            if best is None or resid < best[0]:
                full = np.zeros(x.shape[1])
                full[list(cols)] = coef
                best = (resid, full)
    if best is None:
        raise ValueError("no engine calls to fit")
    return CpuEngineCosts(*(float(v) for v in best[1]))


def _features(call: dict[str, Any]) -> list[float]:
    b, length, steps = call["batch"], call["prompt_len"], call["decode_steps"]
    return [1.0, b * length, steps, steps * b, b * _ctx_sum(length, steps)]


def predicted_s(costs: CpuEngineCosts, call: dict[str, Any]) -> float:
    """The model's time for one recorded call's shape."""
    return costs.prefill_s(call["batch"], call["prompt_len"]) + costs.decode_steps_s(
        call["batch"], call["prompt_len"], call["decode_steps"])


def fit_report(costs: CpuEngineCosts, calls: list[dict[str, Any]]) -> dict[str, float]:
    """How well the fit explains the calls: total time ratio and per-call error."""
    pred = [predicted_s(costs, c) for c in calls]
    wall = [c["wall_s"] for c in calls]
    errs = [abs(p / w - 1.0) for p, w in zip(pred, wall, strict=True) if w > 0]
    return {
        "num_calls": float(len(calls)),
        "measured_total_s": float(sum(wall)),
        "fitted_total_s": float(sum(pred)),
        "median_abs_rel_err": statistics.median(errs) if errs else 0.0,
        "median_call_s": statistics.median(wall) if wall else 0.0,
    }
