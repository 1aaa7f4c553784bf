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

Bookkeeping (session 15, speed only): a segment's decoding turns all advance by the same
number of steps, so the instance keeps a decode clock (steps applied so far) and each
decoding turn its clock at completion and its context minus the clock. The batch's
decoding count, KV tokens and fewest steps left are then kept as integers (a heap of
completion clocks), not recounted over every turn at each event; the results are the
same to the bit (``tests/unit/sim/test_sim_speed_pins.py``).
"""

from __future__ import annotations

import heapq
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
    """One turn in an instance: prefill then decode.

    Once it decodes, ``decode_left`` and ``ctx`` are the values when it started decoding
    (``Instance.decode_left`` / ``Instance.ctx_of`` give the current ones); a finished
    turn's are brought up to date.
    """

    traj: Any
    prefill_left: int
    decode_left: int
    ctx: int
    reserve: int
    prefill_ctx: int = 0
    order: int = 0
    """Admission order in its instance (finished turns are reported in this order)."""
    end_clock: int = 0
    """The instance's decode clock at which this turn's last token is decoded."""
    ctx_base: int = 0
    """Context minus the decode clock, while decoding."""


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
    running: dict[int, Seq] = field(default_factory=dict)
    """Admitted turns by admission order (iteration is admission order)."""
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
    _clock: int = 0
    """Decode steps applied so far (every decoding turn advances by each of them)."""
    _admitted: int = 0
    _decoding: list = field(default_factory=list)
    """Heap of (end clock, order, turn) of the decoding turns."""
    _prefilling: deque = field(default_factory=deque)
    """Turns still prefilling, in admission order (only the first one progresses)."""
    _ctx_base_sum: int = 0
    """Sum of the decoding turns' ``ctx_base`` (their KV tokens minus count x clock)."""

    @classmethod
    def create(
        cls, iid: str, tp: int, bucket: str, node: int, hw: HardwareSpec, model: ModelSpec
    ) -> Instance:
        """A fresh, empty instance."""
        inst = cls(iid, tp, bucket, node, kv_capacity_tokens(hw, model, tp), hw, model)
        inst._timer = step_timer(hw, model, tp)
        return inst

    # Timing.

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
            seq.order = self._admitted
            self._admitted += 1
            self.running[seq.order] = seq
            if seq.prefill_left > 0:
                self._prefilling.append(seq)
            else:
                self._start_decoding(seq)
            self.kv_reserved += seq.reserve
            self.max_kv_reserved = max(self.max_kv_reserved, self.kv_reserved)

    def decode_left(self, seq: Seq) -> int:
        """Tokens ``seq`` has left to decode now."""
        return seq.end_clock - self._clock if seq.prefill_left <= 0 else seq.decode_left

    def ctx_of(self, seq: Seq) -> int:
        """``seq``'s context now."""
        return seq.ctx_base + self._clock if seq.prefill_left <= 0 else seq.ctx

    def _start_decoding(self, seq: Seq) -> None:
        seq.end_clock = self._clock + seq.decode_left
        seq.ctx_base = seq.ctx - self._clock
        self._ctx_base_sum += seq.ctx_base
        heapq.heappush(self._decoding, (seq.end_clock, seq.order, seq))

    def advance(self, k: int) -> list[Seq]:
        """Apply ``k`` steps of the current segment; return the turns that finished
        (in admission order)."""
        if k <= 0:
            return []
        elapsed = self.seg_elapsed(k)
        self.busy_s += elapsed
        self.seg_start += elapsed
        # The turn prefilling at the segment's start does not decode in it, even if its
        # prefill ends within it: it joins the decoders after the clock moves.
        head = self._prefilling[0] if self.seg_chunk and self._prefilling else None
        self._clock += k
        done: list[Seq] = []
        while self._decoding and self._decoding[0][0] <= self._clock:
            done.append(heapq.heappop(self._decoding)[2])
        if head is not None:
            take = min(head.prefill_left, k * PREFILL_CHUNK_TOKENS)
            head.prefill_left -= take
            head.ctx += take
            if head.prefill_left <= 0:
                self._prefilling.popleft()
                self._start_decoding(head)
        self.seg_steps -= k
        if len(done) > 1:
            done.sort(key=_order)
        for seq in done:
            seq.decode_left = seq.end_clock - self._clock
            seq.ctx = seq.ctx_base + self._clock
            self._ctx_base_sum -= seq.ctx_base
            del self.running[seq.order]
            self.kv_reserved -= seq.reserve
        return done

    def plan_segment(self, now: float) -> float | None:
        """Start the next segment at ``max(now, pause)``; return its end time (None if idle)."""
        self.version += 1
        self.seg_start = now if now >= self.pause_until else self.pause_until
        if not self.running or not self.alive:
            self.seg_steps = 0
            return None
        # The decoding turns' count, context (ints: exact) and fewest tokens left; the
        # first turn still prefilling.
        n_dec = len(self._decoding)
        kv = float(self._ctx_base_sum + n_dec * self._clock)
        if self._prefilling:
            head = self._prefilling[0]
            n = -(-head.prefill_left // PREFILL_CHUNK_TOKENS)
            chunk = min(PREFILL_CHUNK_TOKENS, head.prefill_left)
            ctx = float(head.ctx)
        else:
            n, chunk, ctx = math.inf, 0, 0.0
        if n_dec:
            fewest_left = self._decoding[0][0] - self._clock
            if fewest_left < n:
                n = fewest_left
        n = int(n) if n >= 1 else 1
        timer = self._timer
        s0 = timer(n_dec, kv, chunk, ctx)
        if n > 1:
            s1 = timer(n_dec, kv + n_dec * (n - 1), chunk, ctx + (n - 1) * chunk)
            slope = (s1 - s0) / (n - 1)
        else:
            slope = 0.0
        self.seg_steps, self.seg_s0, self.seg_slope, self.seg_chunk = n, s0, slope, chunk
        return self.seg_start + self.seg_elapsed(n)

    def evict_all(self) -> list[Any]:
        """Drop every turn (instance torn down); return their trajectories."""
        trajs = [s.traj for s in self.running.values()] + [s.traj for s in self.waiting]
        self.running, self.waiting, self.kv_reserved, self.seg_steps = {}, deque(), 0, 0
        self._decoding, self._prefilling, self._ctx_base_sum = [], deque(), 0
        self.version += 1
        return trajs


def _order(seq: Seq) -> int:
    return seq.order
