"""The trainer's client without sockets: the method surface of
``libra.clients.runner.GrpcTrainerClient`` calling a :class:`TrainerCore` in this process
(pure: no grpc), for a one-process debugging loop.

Errors reach the caller as they would over gRPC: a domain error is rebuilt from its
status name and text (``libra.errors.error_from_status``, what the gRPC client does), and
any other exception becomes ``Internal``, as the server's error interceptor answers it.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from libra import types as t
from libra.errors import Internal, error_from_status
from services.trainer.core import TrainerCore

R = TypeVar("R")


class InProcessTrainerClient:
    """``GrpcTrainerClient``'s methods on a core in this process."""

    address = "in-process"

    def __init__(self, core: TrainerCore) -> None:
        self._core = core

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Start a job; ``resume`` continues it from its newest checkpoint."""
        await _as_over_grpc(self._core.start_job(job_id, resume=resume))

    async def stop_job(self, job_id: str) -> None:
        await _as_over_grpc(self._core.stop_job(job_id))

    async def status(self) -> t.TrainerStatus:
        return self._core.status()

    async def close(self) -> None:
        """Nothing to close (the core's owner drains it)."""


async def _as_over_grpc(call: Awaitable[R]) -> R:
    try:
        return await call
    except Exception as exc:
        status_name = getattr(exc, "grpc_status_name", None)
        if status_name is None:
            raise Internal(f"trainer: {type(exc).__name__}: {exc}") from exc
        raise error_from_status(status_name, str(exc)) from exc
