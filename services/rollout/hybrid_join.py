"""A rollout worker lent to training: the hybrid's side of the join protocol (pure).

:class:`HybridJoin` runs one lend, from the hello to the detach, over the trainer's
gradient channel (messages in :mod:`libra.training.channel`). Its phases follow the
reference's join states: ``requested`` (channel opening) -> ``fetching_state`` (loading
the core's snapshot) -> ``zero_sync`` (applying the core's merged updates until caught
up; it contributes nothing) -> ``activating`` (taking a hybrid-training epoch) ->
``active`` (one slice per step, lockstep updates) -> ``detached``. A cancelled lend (a
newer generation) ends it where it stands; any error ends it as ``failed``. The caller
(the rollout core) returns the worker to rollout either way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from libra.errors import FailedPrecondition
from libra.training import channel as ch
from libra.training.samples import TrainSample

logger = logging.getLogger(__name__)


class HybridTrainer(Protocol):
    """The torch side: the core's state, kept in lockstep."""

    @property
    def lockstep_check_interval(self) -> int: ...

    def apply_update(self, data: bytes, lr: float) -> float: ...

    def slice_gradient(self, samples: list[TrainSample], scale: float
                       ) -> tuple[bytes, dict[str, float], bool]: ...

    def checksum(self) -> str: ...


class GradientStream(Protocol):
    async def send(self, msg: ch.HybridMessage) -> None: ...

    async def recv(self) -> ch.CoreMessage | None: ...

    async def close(self) -> None: ...


class ChannelOpener(Protocol):
    async def open(self, address: str, hello: ch.Hello) -> GradientStream: ...


TrainerLoader = Callable[[ch.Snapshot], HybridTrainer]


class HybridJoin:
    """One lend of this worker to the core trainer."""

    def __init__(self, hello: ch.Hello, trainer_address: str, opener: ChannelOpener,
                 load_trainer: TrainerLoader, activate: Callable[[], Awaitable[int]]) -> None:
        self.hello = hello
        self._address = trainer_address
        self._opener = opener
        self._load_trainer = load_trainer
        self._activate = activate
        self.phase = "requested"
        self.epoch = hello.epoch
        self.state_step = -1
        self.steps_contributed = 0
        self.detach_reason = ""
        self._trainer: HybridTrainer | None = None

    async def run(self) -> None:
        """Serve the channel until the core detaches this worker or the stream ends."""
        stream = await self._opener.open(self._address, self.hello)
        try:
            while (msg := await stream.recv()) is not None:
                if isinstance(msg, ch.Detach):
                    self.detach_reason = msg.reason
                    break
                await self._handle(stream, msg)
            else:
                self.detach_reason = self.detach_reason or "stream ended"
        finally:
            self.phase = "detached" if self.phase != "failed" else self.phase
            await stream.close()

    async def _handle(self, stream: GradientStream, msg: ch.CoreMessage) -> None:
        if isinstance(msg, ch.Snapshot):
            self.phase = "fetching_state"
            self._trainer = await asyncio.to_thread(self._load_trainer, msg)
            self.state_step = msg.step
            self.phase = "zero_sync"
            await stream.send(ch.Applied(msg.step))
        elif isinstance(msg, ch.Update):
            await self._apply(stream, msg)
        elif isinstance(msg, ch.Offer):
            self.phase = "activating"
            self.epoch = await self._activate()
            await stream.send(ch.Activated(self.epoch, self.state_step))
        elif isinstance(msg, ch.SliceTask):
            await stream.send(await self._slice(msg))

    def _require_trainer(self) -> HybridTrainer:
        if self._trainer is None:
            raise FailedPrecondition("message before the state snapshot")
        return self._trainer

    async def _apply(self, stream: GradientStream, msg: ch.Update) -> None:
        trainer = self._require_trainer()
        if msg.step != self.state_step + 1:
            raise FailedPrecondition(f"update for step {msg.step} after step "
                                     f"{self.state_step}: an update was lost")
        if not msg.skipped:
            await asyncio.to_thread(trainer.apply_update, msg.data, msg.lr)
        self.state_step = msg.step
        interval = trainer.lockstep_check_interval
        checksum = ""
        if interval and msg.step % interval == 0 and not msg.skipped:
            checksum = await asyncio.to_thread(trainer.checksum)
        await stream.send(ch.Applied(msg.step, checksum))

    async def _slice(self, task: ch.SliceTask) -> ch.GradientPayload:
        trainer = self._require_trainer()
        if task.step != self.state_step + 1 or task.epoch != self.epoch:
            raise FailedPrecondition(
                f"slice task for step {task.step} epoch {task.epoch}, but this worker is "
                f"at step {self.state_step} epoch {self.epoch}")
        self.phase = "active"
        data, metrics, finite = await asyncio.to_thread(trainer.slice_gradient, task.samples,
                                                        task.scale)
        self.steps_contributed += 1
        return ch.GradientPayload(task.step, task.policy_version, self.epoch, task.slice_id,
                                  data, metrics, not finite)
