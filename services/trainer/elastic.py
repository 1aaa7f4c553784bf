"""The core's side of the elastic hybrid pool: the gradient domain (pure).

Hybrids (rollout workers lent to training) connect over the gradient channel
(:mod:`libra.training.channel`). The domain keeps one :class:`HybridSession` each and
moves it through its join states at step boundaries only, so the core's loop never
waits on a join:

``connected -> snapshot`` (core state written, merged updates streamed from then on)
``-> offered`` (the hybrid caught up with the core's step) ``-> active`` (it answered
with a hybrid-training epoch and is still caught up at a boundary) ``-> detached``.

While joining, a hybrid contributes nothing: with no collective on this channel there
is no shape to keep, so "zero gradients" means no payload is counted. An active hybrid
gets one slice of each batch; its payload is merged only when its step, policy version,
epoch and slice match the core's (:meth:`GradientDomain.accept`). A slice whose payload
is late, stale or lost is computed by the core itself (re-assigned, never dropped) and
the hybrid is detached. ``membership_epoch`` counts joins, activations and detaches.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from libra.clock import Clock
from libra.training import channel as ch
from libra.training.samples import TrainSample

logger = logging.getLogger(__name__)

# Core checksums kept to compare with late lockstep acknowledgements.
_CHECKSUMS_KEPT = 64

EventSink = Callable[..., Awaitable[None]]


@dataclass
class HybridSession:
    """One connected hybrid, as the core sees it."""

    hello: ch.Hello
    connected_at_s: float
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    state: str = "connected"
    base_step: int | None = None
    applied_step: int = -1
    active_epoch: int | None = None
    activated_at_s: float | None = None
    payloads: deque[ch.GradientPayload] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    steps_contributed: int = 0

    @property
    def worker_id(self) -> str:
        return self.hello.worker_id

    @property
    def detached(self) -> bool:
        return self.state == "detached"

    def send(self, msg: ch.CoreMessage) -> None:
        if not self.detached:
            self.outbox.put_nowait(msg)


def split_slices(samples: list[TrainSample], num_slices: int) -> list[list[TrainSample]]:
    """Whole GRPO groups per slice, balanced by trainable tokens (largest group first).

    Fewer slices come back when there are fewer groups than slices.
    """
    groups: dict[str, list[TrainSample]] = {}
    for sample in samples:
        groups.setdefault(sample.group_id, []).append(sample)
    ordered = sorted(groups.values(), key=lambda g: (-_tokens(g), g[0].group_id))
    slices: list[list[TrainSample]] = [[] for _ in range(min(num_slices, len(ordered)))]
    loads = [0] * len(slices)
    for group in ordered:
        i = loads.index(min(loads))
        slices[i].extend(group)
        loads[i] += _tokens(group)
    return slices


def _tokens(samples: list[TrainSample]) -> int:
    return sum(sum(s.loss_mask) for s in samples)


class GradientDomain:
    """Sessions, join states, slice assignment and the payload acceptance rule."""

    def __init__(self, clock: Clock, record_event: EventSink) -> None:
        self._clock = clock
        self._record_event = record_event
        self.sessions: dict[str, HybridSession] = {}
        self.membership_epoch = 0
        self._checksums: dict[int, str] = {}
        self.rejected_payloads = 0
        self.lockstep_verified = 0
        self._pending_events: list[tuple[str, dict[str, str]]] = []

    # -- membership -----------------------------------------------------------------------

    def connect(self, hello: ch.Hello) -> HybridSession:
        """A hybrid opened the channel; a newer epoch of the same worker replaces the old."""
        old = self.sessions.get(hello.worker_id)
        if old is not None and not old.detached:
            if old.hello.epoch >= hello.epoch:
                raise ValueError(f"worker {hello.worker_id} already connected at epoch "
                                 f"{old.hello.epoch} >= {hello.epoch}")
            self._detach(old, "replaced by a newer epoch")
        session = HybridSession(hello, self._clock.now_s())
        self.sessions[hello.worker_id] = session
        self.membership_epoch += 1
        logger.info("[elastic] connected worker_id=%s epoch=%d generation=%d",
                    hello.worker_id, hello.epoch, hello.generation)
        return session

    def disconnect(self, session: HybridSession, reason: str) -> None:
        if self.sessions.get(session.worker_id) is session and not session.detached:
            self._detach(session, reason)

    def _detach(self, session: HybridSession, reason: str) -> None:
        was_active = session.state == "active"
        session.send(ch.Detach(reason))
        session.state = "detached"
        session.arrived.set()
        self.membership_epoch += 1
        logger.info("[elastic] detached worker_id=%s reason=%s", session.worker_id, reason)
        self._pending_events.append(("hybrid_detached", {
            "worker_id": session.worker_id, "reason": reason,
            "was_active": str(was_active),
            "steps_contributed": str(session.steps_contributed)}))

    def active(self) -> list[HybridSession]:
        return [s for s in self.sessions.values() if s.state == "active"]

    def joining(self) -> list[HybridSession]:
        return [s for s in self.sessions.values()
                if s.state in ("connected", "snapshot", "offered")]

    # -- messages from hybrids ------------------------------------------------------------

    def on_message(self, session: HybridSession, msg: ch.HybridMessage) -> None:
        if session.detached:
            return
        if isinstance(msg, ch.Applied):
            session.applied_step = msg.step
            self._check_lockstep(session, msg)
        elif isinstance(msg, ch.Activated):
            if msg.epoch <= session.hello.epoch:
                self._detach(session, f"activation epoch {msg.epoch} is not newer than "
                                      f"{session.hello.epoch}")
                return
            session.active_epoch = msg.epoch
        elif isinstance(msg, ch.GradientPayload):
            session.payloads.append(msg)
            session.arrived.set()

    def _check_lockstep(self, session: HybridSession, msg: ch.Applied) -> None:
        expected = self._checksums.get(msg.step)
        if not msg.checksum or expected is None:
            return
        if msg.checksum == expected:
            self.lockstep_verified += 1
            return
        self._detach(session, f"lockstep mismatch at step {msg.step}")

    # -- step boundaries ------------------------------------------------------------------

    async def at_boundary(self, step: int, snapshot: Callable[[int], Awaitable[ch.Snapshot]]
                          ) -> None:
        """Advance join states; ``step`` steps are done. Never waits on a hybrid."""
        for session in list(self.sessions.values()):
            if session.state == "connected":
                session.send(await snapshot(step))
                session.base_step, session.applied_step = step, -1
                session.state = "snapshot"
                await self._record_event("hybrid_snapshot_sent", worker_id=session.worker_id,
                                         step=str(step))
            elif session.state == "snapshot" and session.applied_step == step:
                session.send(ch.Offer(step))
                session.state = "offered"
            elif (session.state == "offered" and session.active_epoch is not None
                    and session.applied_step == step):
                session.state = "active"
                session.activated_at_s = self._clock.now_s()
                self.membership_epoch += 1
                await self._record_event(
                    "hybrid_activated", worker_id=session.worker_id,
                    epoch=str(session.active_epoch), step=str(step),
                    join_s=f"{session.activated_at_s - session.connected_at_s:.3f}")
        await self.flush_events()

    async def flush_events(self) -> None:
        events, self._pending_events = self._pending_events, []
        for kind, fields in events:
            await self._record_event(kind, **fields)

    def remember_checksum(self, step: int, checksum: str) -> None:
        self._checksums[step] = checksum
        for old in [s for s in self._checksums if s <= step - _CHECKSUMS_KEPT]:
            del self._checksums[old]

    def broadcast(self, update: ch.Update) -> None:
        """Send a merged update to every hybrid whose state is behind it."""
        for session in self.sessions.values():
            if session.base_step is not None and session.base_step < update.step:
                session.send(update)

    # -- payloads -------------------------------------------------------------------------

    def accept(self, session: HybridSession, payload: ch.GradientPayload, step: int,
               policy_version: int) -> str | None:
        """None when the payload counts; otherwise why it is refused."""
        if session.state != "active":
            return f"worker is {session.state}, not active"
        if payload.epoch != session.active_epoch:
            return f"epoch {payload.epoch} != {session.active_epoch}"
        if payload.step != step:
            return f"step {payload.step} != {step}"
        if payload.policy_version != policy_version:
            return f"policy version {payload.policy_version} != {policy_version}"
        return None

    async def gather(self, assigned: dict[int, HybridSession], step: int,
                     policy_version: int, deadline_s: float
                     ) -> tuple[dict[int, ch.GradientPayload], dict[int, str]]:
        """Wait (at most ``deadline_s``) for each assigned slice's payload.

        Returns the accepted payloads by slice and, for the others, why they are
        missing; hybrids that missed are detached.
        """
        accepted: dict[int, ch.GradientPayload] = {}
        missing: dict[int, str] = {}
        end_s = self._clock.now_s() + deadline_s
        for slice_id, session in assigned.items():
            payload, reason = await self._await_payload(session, end_s)
            if payload is not None:
                reason = self.accept(session, payload, step, policy_version)
                if reason is None and payload.slice_id != slice_id:
                    reason = f"slice {payload.slice_id} != {slice_id}"
                if reason is not None:
                    self.rejected_payloads += 1
                    await self._record_event("payload_rejected", worker_id=session.worker_id,
                                             step=str(step), reason=reason)
            if reason is None and payload is not None:
                accepted[slice_id] = payload
                session.steps_contributed += 1
            else:
                missing[slice_id] = reason or "no payload"
                self.disconnect(session, f"slice {slice_id} of step {step}: {missing[slice_id]}")
        await self.flush_events()
        return accepted, missing

    async def _await_payload(self, session: HybridSession, end_s: float
                             ) -> tuple[ch.GradientPayload | None, str | None]:
        """The session's next payload (a hybrid has one slice per step in flight)."""
        while True:
            if session.payloads:
                return session.payloads.popleft(), None
            if session.detached:
                return None, "hybrid detached"
            remaining_s = end_s - self._clock.now_s()
            if remaining_s <= 0:
                return None, "deadline passed"
            session.arrived.clear()
            try:
                async with asyncio.timeout(remaining_s):
                    await session.arrived.wait()
            except TimeoutError:
                return None, "deadline passed"
