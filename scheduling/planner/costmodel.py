"""Analytic cost model of the planner: rollout makespan per layout, training step time.

Roofline per device (design digest 5.2, issue 6): a decode step reads the weights
shard and the batch's KV cache from HBM, a prefill chunk is FLOP-bound; a step takes
the larger of the two plus a TP all-reduce term. One difference from the reference
code: it divides the weight bytes by TP twice (``(W/TP + KV) / (TP * bw)``); here
every quantity is per device, so weights are divided once.

The same functions drive the cluster simulator's instances, so a planner prediction
and a simulated run disagree only through dynamics (batch occupancy, tool waits,
queueing), which is what the calibrator learns.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scheduling.planner.specs import HardwareSpec, ModelSpec

PREFILL_CHUNK_TOKENS = 1024
"""Chunked-prefill budget per step (reference cost model)."""
MAX_BATCH_SEQS = 256
"""Sequences per engine step (vLLM ``max_num_seqs`` default, reference cap on b-bar)."""
KV_FRAGMENTATION = 0.04
"""KV capacity lost to block fragmentation (reference cost model 4%)."""
WORKSPACE_BYTES = 2 * 1024**3
"""Activation workspace per device kept out of the KV pool (our assumption: the vLLM
profile run of a 1,024-token chunk on 4B-30B models peaks at ~1-2 GiB)."""


@dataclass(frozen=True, slots=True)
class RequestStats:
    """One trajectory of the length history, as the cost model sees it."""

    prompt_tokens: int
    gen_tokens: int
    """Post-prompt tokens (model output plus tool payloads)."""
    tool_s: float = 0.0
    """Total tool latency (the GPU serves others meanwhile; only the critical path pays)."""


def kv_bytes_per_token(model: ModelSpec, tp: int) -> float:
    """KV bytes one token occupies on each device of a TP group (heads replicate past TP)."""
    heads_per_gpu = max(1.0, model.num_kv_heads / tp)
    return 2.0 * model.num_layers * heads_per_gpu * model.head_dim * model.dtype_bytes


def weight_bytes_per_gpu(model: ModelSpec, tp: int) -> float:
    """Resident weight bytes per device."""
    return model.num_params * model.dtype_bytes / tp


def weights_read_per_gpu(model: ModelSpec, tp: int, num_tokens: int) -> float:
    """Weight bytes one engine step reads per device.

    Dense: all weights. MoE: non-expert weights plus the experts the step's tokens
    touch, in expectation ``1 - (1 - k/E)^n`` of them (uniform routing).
    """
    if not model.is_moe:
        return weight_bytes_per_gpu(model, tp)
    touched = 1.0 - (1.0 - model.num_active_experts / model.num_experts) ** max(1, num_tokens)
    dense = model.num_params - model.expert_params
    return (dense + model.expert_params * touched) * model.dtype_bytes / tp


def kv_capacity_tokens(hw: HardwareSpec, model: ModelSpec, tp: int) -> int:
    """Tokens of KV cache an instance of ``tp`` devices can hold (0 if weights do not fit)."""
    free = hw.hbm_bytes * hw.memory_utilization - weight_bytes_per_gpu(model, tp) - WORKSPACE_BYTES
    if free <= 0:
        return 0
    return int(free / kv_bytes_per_token(model, tp) * (1.0 - KV_FRAGMENTATION))


def tp_comm_s(hw: HardwareSpec, model: ModelSpec, tp: int, num_tokens: int) -> float:
    """Two ring all-reduces of the activations per layer (attention and MLP outputs)."""
    if tp <= 1:
        return 0.0
    payload = num_tokens * model.hidden_size * model.dtype_bytes
    per_allreduce = (
        hw.allreduce_latency_s + 2.0 * (tp - 1) / tp * payload / hw.intra_node_bw_bytes_per_s
    )
    return 2.0 * model.num_layers * per_allreduce


def step_s(
    hw: HardwareSpec,
    model: ModelSpec,
    tp: int,
    num_decode: int,
    kv_tokens: float,
    prefill_tokens: int = 0,
    prefill_ctx_tokens: float = 0.0,
) -> float:
    """Time of one engine step: ``num_decode`` decode tokens plus one prefill chunk.

    Args:
        hw: Device.
        model: Model.
        tp: Tensor-parallel degree of the instance.
        num_decode: Sequences decoding one token each.
        kv_tokens: Context tokens of those sequences (KV read this step).
        prefill_tokens: Prompt tokens prefilled in this step (a chunk, 0 for none).
        prefill_ctx_tokens: Context already cached before the chunk (attention span).
    """
    num_tokens = num_decode + prefill_tokens
    if num_tokens <= 0:
        return 0.0
    bytes_read = weights_read_per_gpu(model, tp, num_tokens) + kv_tokens * kv_bytes_per_token(
        model, tp
    )
    attn_unit = 4.0 * model.num_layers * model.num_heads * model.head_dim
    flops = 2.0 * model.num_active_params * num_tokens + attn_unit * kv_tokens
    if prefill_tokens:
        flops += attn_unit * prefill_tokens * (prefill_ctx_tokens + prefill_tokens / 2.0)
    t_mem = bytes_read / (hw.hbm_bw_bytes_per_s * hw.hbm_efficiency)
    t_flop = flops / tp / (hw.peak_flops * hw.prefill_mfu)
    return max(t_mem, t_flop) + tp_comm_s(hw, model, tp, num_tokens)


def prefill_s(
    hw: HardwareSpec, model: ModelSpec, tp: int, tokens: int, ctx_tokens: float = 0.0
) -> float:
    """Time to prefill ``tokens`` alone, in ``PREFILL_CHUNK_TOKENS`` chunks."""
    total, done = 0.0, 0
    while done < tokens:
        chunk = min(PREFILL_CHUNK_TOKENS, tokens - done)
        total += step_s(hw, model, tp, 0, 0.0, chunk, ctx_tokens + done)
        done += chunk
    return total


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

        ``T = max(1 / sum_t(n_t / W_t), min_t latency_t(longest))`` where ``W_t`` is the
        history's work on one instance of TP ``t``, times ``scale`` (requests per step
        over history size). ``pipeline_depth`` steps of rollout overlap in an async job
        (staleness bound + 1), so one step's critical path is spread over that many steps.
        """
        tps = [tp for tp, n in counts_by_tp.items() if n > 0]
        if not self.fits(tps):
            return math.inf
        conc = len(self.history) * scale * max(1, pipeline_depth) / sum(counts_by_tp.values())
        key = _concurrency_key(conc)
        fast = self._fast
        rate = 0.0
        floor = math.inf
        for tp in tps:
            terms = fast.get((tp, key)) or self._fast_terms(tp, conc)
            rate += counts_by_tp[tp] / (terms[0] * scale)
            if terms[1] < floor:
                floor = terms[1]
        return max(1.0 / rate, floor / max(1, pipeline_depth))

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
            rate, floor = 0.0, math.inf
            for tp, n in items:
                terms = fast.get((tp, key)) or self._fast_terms(tp, conc)
                rate += n / (terms[0] * scale)
                if terms[1] < floor:
                    floor = terms[1]
            t = max(1.0 / rate, floor / depth)
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


@dataclass(frozen=True, slots=True)
class TrainParallelism:
    """Training parallelism of the core group (one replica is ``tp * pp`` devices)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int = 1

    @property
    def num_gpus(self) -> int:
        """Devices of the training group."""
        return self.tp * self.pp * self.dp


DP_EXPOSED_FRACTION = {True: 0.70, False: 0.50}
"""Fraction of the DP gradient all-reduce not hidden behind backward (reference: 70% for
pp = 1, 50% for pp > 1)."""


def train_step_s(
    hw: HardwareSpec,
    model: ModelSpec,
    par: TrainParallelism,
    tokens_per_step: float,
    mean_seq_tokens: float,
) -> float:
    """One GRPO training step: log-prob recompute forward plus forward/backward.

    FLOPs = (2 recompute + 6 train) x active params x tokens, plus causal attention;
    divided over the group at ``train_mfu``; plus the exposed DP all-reduce of bf16
    gradients over the inter-node network and the 1F1B pipeline bubble.
    """
    if par.num_gpus <= 0:
        return math.inf
    attn = 4.0 * model.num_layers * model.num_heads * model.head_dim * mean_seq_tokens / 2.0
    flops = (8.0 * model.num_active_params + 4.0 * attn) * tokens_per_step
    compute = flops / (par.num_gpus * hw.peak_flops * hw.train_mfu)
    micro_batches = max(
        1.0, tokens_per_step / max(1.0, mean_seq_tokens) / (par.dp * par.micro_batch)
    )
    compute *= 1.0 + (par.pp - 1) / micro_batches
    grad_bytes = model.num_params * 2.0 / (par.tp * par.pp)
    allreduce = 0.0
    if par.dp > 1:
        allreduce = 2.0 * (par.dp - 1) / par.dp * grad_bytes / hw.inter_node_bw_bytes_per_s
    return compute + DP_EXPOSED_FRACTION[par.pp == 1] * allreduce


def train_memory_fits(
    hw: HardwareSpec, model: ModelSpec, par: TrainParallelism, seq_tokens: int
) -> bool:
    """Weights + grads (bf16) + distributed Adam state (12 B/param over DP) + activations.

    Activations: 34 x seq x hidden bytes per layer over TP (Korthikanti et al. 2022,
    selective recompute with sequence parallelism), layers split over PP; plus the
    log-prob logits temporary (seq x vocab/TP x 4 B x 1.5).
    """
    shard = model.num_params / (par.tp * par.pp)
    states = 4.0 * shard + 12.0 * shard / par.dp
    act = (
        34.0
        * seq_tokens
        * par.micro_batch
        * model.hidden_size
        * model.num_layers
        / (par.tp * par.pp)
    )
    logits = seq_tokens * par.micro_batch * model.vocab_size / par.tp * 4.0 * 1.5
    return states + act + logits <= hw.hbm_bytes * 0.92
