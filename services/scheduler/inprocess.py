"""``InProcessSchedulerClient``: the scheduler client's surface
(``libra.clients.api.SchedulerClientApi``) served by a ``SchedulerCore`` in this
process, without sockets: for a one-process debugging loop.

It does what the servicer does between the wire and the core - fence a report by the
instance's lease epoch, decide it as a batch of one, count the decision - and gives the
caller the errors the gRPC client would raise: a domain error (``libra.errors``, or a
core's own error declaring a gRPC status) as it is, any other failure as ``Internal``
(the gRPC client sees INTERNAL). A report is answered at once, so ``needs_answer`` has
nothing to wait for here.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from libra import types as t
from libra.errors import Internal, LibraError
from services.scheduler.core import SchedulerCore, ToolReturnReport
from services.scheduler.metrics import record_decision

T = TypeVar("T")


class InProcessSchedulerClient:
    """The scheduler client over a core in this process."""

    def __init__(self, core: SchedulerCore) -> None:
        self._core = core

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Schedule a job; ``resume``: it ran before and ended."""
        await _as_client_error(self._core.start_job(job_id, resume=resume))

    async def stop_job(self, job_id: str) -> None:
        await _as_client_error(self._core.stop_job(job_id))

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision:
        """The scheduler's decision for one tool return, fenced by ``lease_epoch``."""
        del needs_answer  # answered at once: nothing is held back in one process
        report = ToolReturnReport(job_id, trajectory_id, state, tokens_so_far)
        (decision,) = await _as_client_error(
            self._core.report_tool_returns(instance_id, lease_epoch, [report]))
        if isinstance(decision, LibraError):
            raise decision
        record_decision(trajectory_id, decision)
        return decision

    async def report_finished(self, job_id: str, trajectory_id: str, total_tokens: int,
                              status: t.TrajectoryStatus, instance_id: str,
                              lease_epoch: int) -> None:
        """One finish reported directly, fenced (the scheduler also reads finishes from
        the job's trajectory stream)."""
        await _as_client_error(self._core.check_fence(instance_id, lease_epoch))
        await _as_client_error(self._core.report_finished(job_id, trajectory_id,
                                                          total_tokens, status))

    async def stats(self, job_id: str) -> dict[str, Any]:
        """The job's scheduling stats, as JSON gives them (the gRPC reply carries JSON)."""
        return json.loads(json.dumps(await _as_client_error(self._core.stats(job_id))))

    async def close(self) -> None:
        """Nothing to close: no channel, no stream."""


async def _as_client_error(call: Awaitable[T]) -> T:
    """``call``'s result, its failure raised as the gRPC client would raise it."""
    try:
        return await call
    except Exception as exc:
        if getattr(exc, "grpc_status_name", None) is not None:
            raise
        raise Internal(f"{type(exc).__name__}: {exc}") from exc
