"""Typed client of the scheduler service; rollout tool-return reports go out in batches.

Every ``report_tool_return`` call joins a queue; one sender task sends what is queued as
one ``ReportToolReturns`` RPC per (instance, lease epoch), with at most one RPC in
flight: reports that arrive while it runs go out together in the next one. With
``linger_s`` > 0 the sender first waits that long for more reports to join (as a Kafka
producer's ``linger.ms``): fewer, larger RPCs for a little latency. The rollout core
awaits the decisions in background tasks and applies a late MOVE mid-turn, so a
trajectory never waits for one and the latency costs it nothing but a later move.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import grpc

from libra import types as t
from libra.clients.base import GrpcClientBase
from libra.errors import LibraError, error_from_status
from libra.proto.scheduler.v1 import scheduler_pb2 as spb
from libra.proto.scheduler.v1 import scheduler_pb2_grpc as spb_grpc
from libra.wire.common import tool_state_to_proto, traj_status_to_proto

_ACTION_IN = {spb.DECISION_ACTION_STAY: t.DecisionAction.STAY,
              spb.DECISION_ACTION_MOVE: t.DecisionAction.MOVE}

# Reports per RPC at most (a larger queue goes out in several RPCs).
MAX_REPORTS_PER_RPC = 256


@dataclass
class _Queued:
    report: spb.ToolReturnReport
    future: asyncio.Future[t.PlacementDecision]


class GrpcSchedulerClient(GrpcClientBase):
    def __init__(self, address: str, timeout_s: float = 10.0, linger_s: float = 0.0) -> None:
        super().__init__(address, timeout_s)
        self._linger_s = linger_s
        self._stub = spb_grpc.SchedulerServiceStub(self._channel)
        self._queue: dict[tuple[str, int], list[_Queued]] = {}
        self._sender: asyncio.Task[None] | None = None
        # Reports made and ReportToolReturns RPCs that carried them (benchmarks, tests).
        self.num_reports = 0
        self.num_report_rpcs = 0

    async def start_job(self, job_id: str) -> None:
        await self._call(self._stub.StartJob, spb.StartJobRequest(job_id=job_id))

    async def stop_job(self, job_id: str) -> None:
        await self._call(self._stub.StopJob, spb.StopJobRequest(job_id=job_id),
                         idempotent=True)

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int) -> t.PlacementDecision:
        """The scheduler's decision for one tool return (sent batched with others)."""
        future: asyncio.Future[t.PlacementDecision] = asyncio.get_running_loop().create_future()
        report = spb.ToolReturnReport(job_id=job_id, trajectory_id=trajectory_id,
                                      state=tool_state_to_proto(state),
                                      tokens_so_far=tokens_so_far)
        self._queue.setdefault((instance_id, lease_epoch), []).append(_Queued(report, future))
        self.num_reports += 1
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_queued())
        return await future

    async def _send_queued(self) -> None:
        # Let reports raised in the same loop iteration (or within the linger) join.
        await asyncio.sleep(self._linger_s)
        while self._queue:
            (instance_id, epoch), items = next(iter(self._queue.items()))
            batch, rest = items[:MAX_REPORTS_PER_RPC], items[MAX_REPORTS_PER_RPC:]
            if rest:
                self._queue[(instance_id, epoch)] = rest
            else:
                del self._queue[(instance_id, epoch)]
            await self._send_batch(instance_id, epoch, batch)

    async def _send_batch(self, instance_id: str, epoch: int, batch: list[_Queued]) -> None:
        request = spb.ReportToolReturnsRequest(instance_id=instance_id, lease_epoch=epoch,
                                               reports=[q.report for q in batch])
        self.num_report_rpcs += 1
        try:
            resp = await self._call(self._stub.ReportToolReturns, request)
        except (LibraError, grpc.aio.AioRpcError) as exc:
            for q in batch:
                _settle(q.future, exc=exc)
            return
        except BaseException as exc:  # cancelled: nobody must wait forever
            for q in batch:
                _settle(q.future, exc=LibraError(f"report not sent: {exc!r}"))
            raise
        for q, d in zip(batch, resp.decisions, strict=True):
            if d.error:
                code, _, details = d.error.partition(": ")
                _settle(q.future, exc=error_from_status(code, details))
            else:
                _settle(q.future, t.PlacementDecision(
                    _ACTION_IN.get(d.action, t.DecisionAction.STAY), d.target_bucket,
                    d.target_instance, d.reason))

    async def report_finished(self, job_id: str, trajectory_id: str, total_tokens: int,
                              status: t.TrajectoryStatus, instance_id: str,
                              lease_epoch: int) -> None:
        """Kept for tools and tests: rollouts no longer call it (the scheduler reads
        finishes from the job's trajectory stream)."""
        await self._call(self._stub.ReportFinished, spb.ReportFinishedRequest(
            job_id=job_id, trajectory_id=trajectory_id, total_tokens=total_tokens,
            status=traj_status_to_proto(status), instance_id=instance_id,
            lease_epoch=lease_epoch), idempotent=True)

    async def stats(self, job_id: str) -> dict[str, Any]:
        resp = await self._call(self._stub.GetSchedulerStats,
                                spb.GetSchedulerStatsRequest(job_id=job_id), idempotent=True)
        return json.loads(resp.stats_json or "{}")

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for items in self._queue.values():
            for q in items:
                _settle(q.future, exc=LibraError("scheduler client closed"))
        self._queue.clear()
        await super().close()


def _settle(future: asyncio.Future[t.PlacementDecision],
            result: t.PlacementDecision | None = None,
            exc: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)  # type: ignore[arg-type]
