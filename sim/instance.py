"""A simulated rollout instance: continuous batching under a KV-capacity limit.

Between two events the batch composition is fixed, so the instance runs a *segment*
of ``n`` identical-shape engine steps whose time grows linearly with the KV read
(every decoding sequence adds one token per step). A segment ends when the first
sequence finishes its turn or the head prefill finishes; an arrival that can be
admitted interrupts it after the step in progress. Step times come from the
planner's roofline (``scheduling.planner.costmodel.step_s``).

KV accounting: admitting a turn reserves its final context (context + this turn's
output); a full cache leaves turns waiting (no preemption is modelled). A trajectory
waiting on a tool holds no reservation; its prefix stays in the prefix cache, so the
next turn on the same instance prefills only the tool payload (after a move: the
whole context).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from scheduling.planner.costmodel import (
    MAX_BATCH_SEQS,
    PREFILL_CHUNK_TOKENS,
    kv_capacity_tokens,
)
from scheduling.planner.roofline import step_timer
from scheduling.planner.specs import HardwareSpec, ModelSpec


class SimInfeasible(RuntimeError):
    """The workload cannot run on the simulated cluster (for example, KV too small)."""


@dataclass(slots=True)
class Seq:
    """One turn in an instance: prefill then decode."""

    traj: Any
    prefill_left: int
    decode_left: int
    ctx: int
    reserve: int
    prefill_ctx: int = 0


@dataclass(slots=True)
class Instance:
    """Engine state of one rollout instance."""

    iid: str
    tp: int
    bucket: str
    node: int
    kv_capacity: int
    hw: HardwareSpec
    model: ModelSpec
    alive: bool = True
    running: list[Seq] = field(default_factory=list)
    waiting: deque = field(default_factory=deque)
    kv_reserved: int = 0
    busy_s: float = 0.0
    max_kv_reserved: int = 0
    # Current segment.
    seg_start: float = 0.0
    seg_steps: int = 0
    seg_s0: float = 0.0
    seg_slope: float = 0.0
    seg_chunk: int = 0
    version: int = 0
    pause_until: float = 0.0
    _timer: Any = None
    """``step_timer`` of this TP degree (``step_s`` with its constants folded)."""

    @classmethod
    def create(
        cls, iid: str, tp: int, bucket: str, node: int, hw: HardwareSpec, model: ModelSpec
    ) -> Instance:
        """A fresh, empty instance."""
        inst = cls(iid, tp, bucket, node, kv_capacity_tokens(hw, model, tp), hw, model)
        inst._timer = step_timer(hw, model, tp)
        return inst

    # Timing.

    def _step(self, num_decode: int, kv_tokens: float, chunk: int, chunk_ctx: float) -> float:
        return self._timer(num_decode, kv_tokens, chunk, chunk_ctx)

    def seg_elapsed(self, k: int) -> float:
        """Time of the first ``k`` steps of the current segment."""
        return k * self.seg_s0 + self.seg_slope * k * (k - 1) / 2.0

    def steps_done_by(self, now: float) -> int:
        """Whole steps of the current segment finished by ``now``, plus the one in progress."""
        dt = now - self.seg_start
        if dt <= 0 or self.seg_steps == 0:
            return 0
        a, b = self.seg_slope / 2.0, self.seg_s0 - self.seg_slope / 2.0
        if a <= 1e-15:
            k = dt / b
        else:
            k = (-b + math.sqrt(b * b + 4 * a * dt)) / (2 * a)
        return min(self.seg_steps, int(math.floor(k)) + 1)

    # State changes.

    def can_admit(self, seq: Seq) -> bool:
        """Room in the batch and in the KV cache."""
        return (
            len(self.running) < MAX_BATCH_SEQS
            and self.kv_reserved + seq.reserve <= self.kv_capacity
        )

    def admit_waiting(self, priority: Any = None) -> None:
        """Move waiting turns into the batch while they fit (FIFO, or by ``priority``)."""
        if not self.waiting:
            return
        if priority is not None and len(self.waiting) > 1:
            self.waiting = deque(sorted(self.waiting, key=priority))
        while self.waiting:
            seq = self.waiting[0]
            if seq.reserve > self.kv_capacity:
                raise SimInfeasible(
                    f"a turn needs {seq.reserve} KV tokens, instance {self.iid} (TP{self.tp}) "
                    f"holds {self.kv_capacity}"
                )
            if not self.can_admit(seq):
                return
            self.waiting.popleft()
            self.running.append(seq)
            self.kv_reserved += seq.reserve
            self.max_kv_reserved = max(self.max_kv_reserved, self.kv_reserved)

    def advance(self, k: int) -> list[Seq]:
        """Apply ``k`` steps of the current segment; return the turns that finished."""
        if k <= 0:
            return []
        self.busy_s += self.seg_elapsed(k)
        self.seg_start += self.seg_elapsed(k)
        chunk_left = self.seg_chunk and k
        done: list[Seq] = []
        prefill_head = next((s for s in self.running if s.prefill_left > 0), None)
        for seq in self.running:
            if seq.prefill_left > 0:
                continue
            seq.decode_left -= k
            seq.ctx += k
            if seq.decode_left <= 0:
                done.append(seq)
        if chunk_left and prefill_head is not None:
            take = min(prefill_head.prefill_left, k * PREFILL_CHUNK_TOKENS)
            prefill_head.prefill_left -= take
            prefill_head.ctx += take
        self.seg_steps -= k
        if done:
            ids = {id(s) for s in done}
            self.running = [s for s in self.running if id(s) not in ids]
            for seq in done:
                self.kv_reserved -= seq.reserve
        return done

    def plan_segment(self, now: float) -> float | None:
        """Start the next segment at ``max(now, pause)``; return its end time (None if idle)."""
        self.version += 1
        self.seg_start = max(now, self.pause_until)
        if not self.running or not self.alive:
            self.seg_steps = 0
            return None
        # One pass: the decoding turns' count, context (ints: the sum is exact in any
        # order) and fewest tokens left; the first turn still prefilling.
        n_dec, kv_tokens, fewest_left, head = 0, 0, math.inf, None
        for s in self.running:
            if s.prefill_left > 0:
                if head is None:
                    head = s
                continue
            n_dec += 1
            kv_tokens += s.ctx
            if s.decode_left < fewest_left:
                fewest_left = s.decode_left
        kv = float(kv_tokens)
        if head is not None:
            n = -(-head.prefill_left // PREFILL_CHUNK_TOKENS)
            chunk = min(PREFILL_CHUNK_TOKENS, head.prefill_left)
            ctx = float(head.ctx)
        else:
            n, chunk, ctx = math.inf, 0, 0.0
        if n_dec:
            n = min(n, fewest_left)
        n = max(1, int(n))
        s0 = self._step(n_dec, kv, chunk, ctx)
        if n > 1:
            s1 = self._step(n_dec, kv + n_dec * (n - 1), chunk, ctx + (n - 1) * chunk)
            slope = (s1 - s0) / (n - 1)
        else:
            slope = 0.0
        self.seg_steps, self.seg_s0, self.seg_slope, self.seg_chunk = n, s0, slope, chunk
        return self.seg_start + self.seg_elapsed(n)

    def evict_all(self) -> list[Any]:
        """Drop every turn (instance torn down); return their trajectories."""
        trajs = [s.traj for s in self.running] + [s.traj for s in self.waiting]
        self.running, self.waiting, self.kv_reserved, self.seg_steps = [], deque(), 0, 0
        self.version += 1
        return trajs
