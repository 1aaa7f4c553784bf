"""Typed client of the scheduler service; rollout tool-return reports go out in batches
on one long-lived stream.

Every ``report_tool_return`` call joins a queue; one sender task sends what is queued as
one batch per (instance, lease epoch) on the client's ``ToolReturns`` stream, with at
most one batch in flight: reports that arrive while it is out go together in the next.
A stream costs its setup (call, metadata, deadline) once instead of per batch, which
is what a rollout instance's report rate makes worth saving. With ``linger_s`` > 0 the
sender first waits that long for more reports to join (as a Kafka producer's
``linger.ms``): fewer, larger batches for a little latency. The rollout core awaits the
decisions in background tasks and applies a late MOVE mid-turn, so a trajectory never
waits for one and the latency costs it nothing but a later move.

A broken stream (scheduler restarted, no answer within the timeout) fails the batch
that was out - its reports get the error, which the rollout treats as "stay" - and
the next batch opens a new stream.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from typing import Any

import grpc

from libra import types as t
from libra.clients.base import GrpcClientBase
from libra.errors import Internal, LibraError, Unavailable, error_from_status
from libra.proto.scheduler.v1 import scheduler_pb2 as spb
from libra.proto.scheduler.v1 import scheduler_pb2_grpc as spb_grpc
from libra.wire.common import tool_state_to_proto, traj_status_to_proto

_ACTION_IN = {spb.DECISION_ACTION_STAY: t.DecisionAction.STAY,
              spb.DECISION_ACTION_MOVE: t.DecisionAction.MOVE}

# Reports per batch at most (a larger queue goes out in several batches).
MAX_REPORTS_PER_BATCH = 256


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
        self._stream: Any = None  # grpc.aio.StreamStreamCall, opened with the first batch
        self._batch_ids = itertools.count(1)
        # Reports made, the batches that carried them and the streams opened for those
        # (benchmarks, tests).
        self.num_reports = 0
        self.num_report_batches = 0
        self.num_report_streams = 0

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
            batch, rest = items[:MAX_REPORTS_PER_BATCH], items[MAX_REPORTS_PER_BATCH:]
            if rest:
                self._queue[(instance_id, epoch)] = rest
            else:
                del self._queue[(instance_id, epoch)]
            await self._send_batch(instance_id, epoch, batch)

    async def _send_batch(self, instance_id: str, epoch: int, batch: list[_Queued]) -> None:
        request = spb.ReportToolReturnsRequest(
            instance_id=instance_id, lease_epoch=epoch, reports=[q.report for q in batch],
            batch_id=next(self._batch_ids))
        self.num_report_batches += 1
        try:
            async with asyncio.timeout(self._timeout_s):  # no task per batch (wait_for)
                resp = await self._exchange(request)
        except (Exception, asyncio.CancelledError) as exc:
            # The stream's state is unknown now (an answer may still come): start over.
            self._drop_stream()
            _fail(batch, _stream_error(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if resp.error:
            _fail(batch, _error_from_text(resp.error))
            return
        for q, d in zip(batch, resp.decisions, strict=True):
            if d.error:
                _settle(q.future, exc=_error_from_text(d.error))
            else:
                _settle(q.future, t.PlacementDecision(
                    _ACTION_IN.get(d.action, t.DecisionAction.STAY), d.target_bucket,
                    d.target_instance, d.reason))

    async def _exchange(self, request: spb.ReportToolReturnsRequest,
                        ) -> spb.ReportToolReturnsResponse:
        """One batch out, its answer back, on the stream (opened on first use, or
        again after it ended; no deadline: it lives as long as the client)."""
        if self._stream is None or self._stream.done():  # ended while idle: replace it
            self._stream = self._stub.ToolReturns()
            self.num_report_streams += 1
        await self._stream.write(request)
        resp = await self._stream.read()
        if resp is grpc.aio.EOF:
            raise Unavailable("the scheduler closed the tool-return stream")
        # An answer that breaks the protocol ends the stream like a broken one.
        if resp.batch_id != request.batch_id:
            raise Internal(f"answer to batch {resp.batch_id}, expected {request.batch_id}")
        if not resp.error and len(resp.decisions) != len(request.reports):
            raise Internal(f"{len(resp.decisions)} decisions for {len(request.reports)} reports")
        return resp

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None

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
            _fail(items, LibraError("scheduler client closed"))
        self._queue.clear()
        if self._stream is not None:
            await self._stream.done_writing()  # the scheduler ends its side cleanly
            self._stream = None
        await super().close()


def _fail(batch: list[_Queued], error: LibraError) -> None:
    for q in batch:
        _settle(q.future, exc=error)


def _error_from_text(text: str) -> LibraError:
    """An error as the stream carries it, "<grpc status name>: <message>"."""
    code, _, details = text.partition(": ")
    return error_from_status(code, details)


def _stream_error(exc: BaseException) -> LibraError:
    if isinstance(exc, LibraError):
        return exc
    if isinstance(exc, grpc.aio.AioRpcError):
        return error_from_status(exc.code().name, exc.details() or "")
    if isinstance(exc, TimeoutError):
        return Unavailable("no answer from the scheduler on the tool-return stream")
    return Unavailable(f"report not sent: {exc!r}")


def _settle(future: asyncio.Future[t.PlacementDecision],
            result: t.PlacementDecision | None = None,
            exc: BaseException | None = None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)  # type: ignore[arg-type]
