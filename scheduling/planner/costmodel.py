"""Analytic cost model of the planner: rollout makespan per layout, training step time.

Step times come from ``roofline`` (one engine step per device) and training times
from ``training_cost``; both are re-exported here for existing callers.

The same functions drive the cluster simulator's instances, so a planner prediction
and a simulated run disagree only through dynamics (batch occupancy, tool waits,
queueing), which is what the calibrator learns.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduling.planner.roofline import (
    KV_FRAGMENTATION,
    MAX_BATCH_SEQS,
    PREFILL_CHUNK_TOKENS,
    WORKSPACE_BYTES,
    kv_bytes_per_token,
    kv_capacity_tokens,
    prefill_s,
    step_s,
    tp_comm_s,
    weight_bytes_per_gpu,
    weights_read_per_gpu,
)
from scheduling.planner.specs import HardwareSpec, ModelSpec
from scheduling.planner.training_cost import (
    DP_EXPOSED_FRACTION,
    TrainParallelism,
    train_memory_fits,
    train_step_s,
)

__all__ = [
    "DP_EXPOSED_FRACTION", "KV_FRAGMENTATION", "MAX_BATCH_SEQS", "PREFILL_CHUNK_TOKENS",
    "WORKSPACE_BYTES", "InstanceProfile", "LayoutCounts", "RequestStats", "RolloutCostModel",
    "TrainParallelism", "instance_profile", "kv_bytes_per_token", "kv_capacity_tokens",
    "prefill_s", "step_s", "tp_comm_s", "train_memory_fits", "train_step_s",
    "weight_bytes_per_gpu", "weights_read_per_gpu",
]



@dataclass(frozen=True, slots=True)
class RequestStats:
    """One trajectory of the length history, as the cost model sees it."""

    prompt_tokens: int
    gen_tokens: int
    """Post-prompt tokens (model output plus tool payloads)."""
    tool_s: float = 0.0
    """Total tool latency (the GPU serves others meanwhile; only the critical path pays)."""


LayoutCounts = tuple[tuple[tuple[int, int], ...], int, int]
"""A rollout layout as the fast model sees it: ((TP, instances), ...) in first-seen order,
total instances, largest TP."""


@dataclass(frozen=True, slots=True)
class InstanceProfile:
    """Steady-state speed of one instance type for a given length history."""

    tp: int
    capacity_tokens: int
    steady_batch: float
    decode_step_s: float
    prefill_s_per_token: float

    def work_s(self, req: RequestStats) -> float:
        """Instance-seconds one request costs when it shares the steady batch."""
        return (
            req.prompt_tokens * self.prefill_s_per_token
            + req.gen_tokens * self.decode_step_s / self.steady_batch
        )

    def latency_s(self, req: RequestStats) -> float:
        """Critical path of one request: it decodes one token per step, plus tool time."""
        return (
            req.prompt_tokens * self.prefill_s_per_token
            + req.gen_tokens * self.decode_step_s
            + req.tool_s
        )


def instance_profile(
    hw: HardwareSpec,
    model: ModelSpec,
    tp: int,
    mean_prompt: float,
    mean_gen: float,
    concurrency: float = math.inf,
) -> InstanceProfile:
    """Capacity, steady batch and step times.

    Steady batch ``min(256, capacity / (prompt + gen/2), concurrency)``: the reference
    formula, also capped by the requests actually in flight per instance (an instance
    with three trajectories decodes a batch of three, whatever its KV room).
    """
    capacity = kv_capacity_tokens(hw, model, tp)
    mean_ctx = max(1.0, mean_prompt + mean_gen / 2.0)
    batch = max(1.0, min(float(MAX_BATCH_SEQS), capacity / mean_ctx, concurrency))
    decode = step_s(hw, model, tp, int(round(batch)), batch * mean_ctx)
    chunk = step_s(hw, model, tp, 0, 0.0, PREFILL_CHUNK_TOKENS, mean_prompt / 2.0)
    return InstanceProfile(tp, capacity, batch, decode, chunk / PREFILL_CHUNK_TOKENS)


class RolloutCostModel:
    """Rollout makespan of a batch of requests on a list of instance TP degrees.

    Args:
        hw: Device.
        model: Model.
        history: Length history (a sample of recent trajectories).
    """

    def __init__(self, hw: HardwareSpec, model: ModelSpec, history: Sequence[RequestStats]) -> None:
        if not history:
            raise ValueError("history must contain at least one request")
        self._hw = hw
        self._model = model
        self.history = tuple(history)
        self._sum_prompt = float(sum(r.prompt_tokens for r in history))
        self._sum_gen = float(sum(r.gen_tokens for r in history))
        self._mean_prompt = self._sum_prompt / len(history)
        self._mean_gen = self._sum_gen / len(history)
        self._longest = max(history, key=lambda r: r.prompt_tokens + r.gen_tokens)
        self._profiles: dict[tuple[int, int], InstanceProfile] = {}
        self._fits: dict[int, bool] = {}
        self._fast: dict[tuple[int, int], tuple[float, float]] = {}

    def profile(self, tp: int, concurrency: float = math.inf) -> InstanceProfile:
        """Cached ``instance_profile`` for ``tp`` at ``concurrency`` requests per instance."""
        key = (tp, _concurrency_key(concurrency))
        prof = self._profiles.get(key)
        if prof is None:
            prof = instance_profile(
                self._hw, self._model, tp, self._mean_prompt, self._mean_gen, float(key[1])
            )
            self._profiles[key] = prof
        return prof

    def fits(self, tps: Sequence[int]) -> bool:
        """Whether the longest request fits in the KV cache of the largest instance."""
        if not tps:
            return False
        largest = max(tps)
        fits = self._fits.get(largest)
        return self._fits_tp(largest) if fits is None else fits

    def _fits_tp(self, tp: int) -> bool:
        fits = self._fits.get(tp)
        if fits is None:
            need = self._longest.prompt_tokens + self._longest.gen_tokens
            fits = self._fits[tp] = self.profile(tp).capacity_tokens >= need
        return fits

    def _fast_terms(self, tp: int, concurrency: float) -> tuple[float, float]:
        """(History work on one instance, longest request's critical path), cached.

        ``work_s`` is linear in (prompt, gen), so the history's work is summed from its
        totals once per (TP, concurrency bucket) instead of once per layout.
        """
        key = (tp, _concurrency_key(concurrency))
        terms = self._fast.get(key)
        if terms is None:
            prof = self.profile(tp, concurrency)
            work = (self._sum_prompt * prof.prefill_s_per_token
                    + self._sum_gen * prof.decode_step_s / prof.steady_batch)
            terms = self._fast[key] = (work, prof.latency_s(self._longest))
        return terms

    def fast_makespan_s(
        self, counts_by_tp: dict[int, int], scale: float = 1.0, pipeline_depth: int = 1
    ) -> float:
        """Closed-form estimate: fluid work split plus the longest request's critical path.

        ``T = max(1 / sum_t(n_t / W_t), L / depth)`` where ``W_t`` is the history's work
        on one instance of TP ``t``, times ``scale`` (requests per step over history size),
        and ``L`` the longest request's critical path on the instance it can be expected
        to run on: the device-weighted mean over the layout, ``sum_t(n_t t L_t) /
        sum_t(n_t t)``. (It was the fastest instance's; a policy that learns a length from
        tool returns places the longest request by load first, and the simulator ran
        such layouts 1.7-3.3x slower than that predicted: issue 20, bench_planner_twin.)
        ``pipeline_depth`` steps of rollout overlap in an async job (staleness bound + 1),
        so one step's critical path is spread over that many steps.
        """
        tps = [tp for tp, n in counts_by_tp.items() if n > 0]
        if not self.fits(tps):
            return math.inf
        conc = len(self.history) * scale * max(1, pipeline_depth) / sum(counts_by_tp.values())
        key = _concurrency_key(conc)
        fast = self._fast
        rate, path, devices = 0.0, 0.0, 0
        for tp in tps:
            terms = fast.get((tp, key)) or self._fast_terms(tp, conc)
            rate += counts_by_tp[tp] / (terms[0] * scale)
            path += counts_by_tp[tp] * tp * terms[1]
            devices += counts_by_tp[tp] * tp
        return max(1.0 / rate, path / devices / max(1, pipeline_depth))

    def work_term_s(
        self, counts_by_tp: dict[int, int], scale: float = 1.0, pipeline_depth: int = 1
    ) -> float:
        """``fast_makespan_s``'s fluid-work term alone (the layout's aggregate rate)."""
        conc = len(self.history) * scale * max(1, pipeline_depth) / sum(counts_by_tp.values())
        rate = sum(n / (self._fast_terms(tp, conc)[0] * scale)
                   for tp, n in counts_by_tp.items() if n > 0)
        return 1.0 / rate

    def unloaded_path_s(self, tp: int) -> float:
        """The longest request's critical path alone on a TP ``tp`` instance (batch 1):
        the straggler term of the step-chain bound (``sim/bounds.py``)."""
        return self.profile(tp, 1).latency_s(self._longest)

    def best_fast_layout(
        self, rows: Sequence[LayoutCounts], scale: float = 1.0, pipeline_depth: int = 1
    ) -> tuple[int, float]:
        """Index and time of the row with the smallest ``fast_makespan_s`` (first on ties).

        Same arithmetic as ``fast_makespan_s`` row by row, in one loop (the search's hot
        path: every split scores every layout). ``(-1, inf)`` when no row fits.
        """
        depth = max(1, pipeline_depth)
        base = len(self.history) * scale * depth
        fast = self._fast
        best_i, best_t = -1, math.inf
        for i, (items, total, largest) in enumerate(rows):
            fits = self._fits.get(largest)
            if not (self._fits_tp(largest) if fits is None else fits):
                continue
            conc = base / total
            key = _concurrency_key(conc)
            rate, path, devices = 0.0, 0.0, 0
            for tp, n in items:
                terms = fast.get((tp, key)) or self._fast_terms(tp, conc)
                rate += n / (terms[0] * scale)
                path += n * tp * terms[1]
                devices += n * tp
            t = max(1.0 / rate, path / devices / depth)
            if t < best_t:
                best_i, best_t = i, t
        return best_i, best_t

    def makespan_s(
        self,
        tps: Sequence[int],
        requests: Sequence[RequestStats] | None = None,
        pipeline_depth: int = 1,
    ) -> float:
        """Greedy longest-first assignment to the instance with the earliest finish.

        An instance's finish is the larger of its summed work and the critical path of
        its longest request. Returns ``inf`` when a request does not fit anywhere.
        """
        requests = self.history if requests is None else requests
        if not self.fits(tps):
            return math.inf
        conc = len(requests) * max(1, pipeline_depth) / max(1, len(tps))
        classes = [(tp, self.profile(tp, conc)) for tp in sorted(set(tps))]
        heaps = {tp: [(0.0, i) for i in range(tps.count(tp))] for tp, _ in classes}
        floor = 0.0
        ordered = sorted(requests, key=lambda r: r.gen_tokens + r.prompt_tokens, reverse=True)
        for req in ordered:
            best = _best_instance(classes, heaps, req)
            if best is None:
                return math.inf
            _, tp, w, latency = best
            heap = heaps[tp]
            heapq.heapreplace(heap, (heap[0][0] + w, heap[0][1]))
            if latency > floor:
                floor = latency
        busy = max((w for heap in heaps.values() for w, _ in heap), default=0.0)
        return max(busy, floor / max(1, pipeline_depth))


def _concurrency_key(concurrency: float) -> int:
    """Profile cache bucket: requests per instance rounded, clamped to [1, 256]."""
    if concurrency < math.inf:
        return min(MAX_BATCH_SEQS, max(1, int(round(concurrency))))
    return MAX_BATCH_SEQS


def _best_instance(
    classes: list[tuple[int, InstanceProfile]],
    heaps: dict[int, list[tuple[float, int]]],
    req: RequestStats,
) -> tuple[float, int, float, float] | None:
    """(finish, TP, work, critical path) of the earliest-finishing class for ``req``.

    ``InstanceProfile.work_s`` / ``latency_s`` inlined (same arithmetic): this runs once
    per request and class in the greedy refinement.
    """
    prompt, gen = req.prompt_tokens, req.gen_tokens
    need = prompt + gen
    best: tuple[float, int, float, float] | None = None
    for tp, prof in classes:
        if prof.capacity_tokens < need:
            continue
        prefill = prompt * prof.prefill_s_per_token
        work = prefill + gen * prof.decode_step_s / prof.steady_batch
        latency = prefill + gen * prof.decode_step_s + req.tool_s
        finish = heaps[tp][0][0] + work
        if latency > finish:
            finish = latency
        if best is None or finish < best[0]:
            best = (finish, tp, work, latency)
    return best
