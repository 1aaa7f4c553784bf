"""Typed client of the scheduler service; rollout tool-return reports go out in batches
on one long-lived stream.

Every ``report_tool_return`` call joins a queue; one sender task sends what is queued as
one batch per (instance, lease epoch) on the client's ``ToolReturns`` stream. A stream
costs its setup (call, metadata, deadline) once instead of per batch, which is what a
rollout instance's report rate makes worth saving. With ``linger_s`` > 0 the sender first
waits that long for more reports to join (as a Kafka producer's ``linger.ms``): fewer,
larger batches for a little latency.

Most decisions are stays, which change nothing at the instance, so the scheduler does not
answer a batch of stays on its own: a reader task takes the answers, and an answer to a
batch settles every earlier unanswered one as all stays. A report made with
``needs_answer`` (the default) is answered even if it stays, and the sender waits for that
answer before the next batch. Past ``max_unanswered`` unanswered batches it also waits,
until an answer makes room: the scheduler answers the batch that fills that window
whatever it holds, if none before it. The rollout core reports with
``needs_answer=False`` and applies a MOVE whenever it comes, mid-turn if need be, so a
trajectory never waits for a decision. Closing the client ends its side of the stream,
and the scheduler then answers the last batch, so nothing is left unsettled.

A broken stream (scheduler restarted, no answer within the timeout where one is due)
fails every unanswered batch - their reports get the error, which the rollout treats as
"stay" - and the next batch opens a new stream.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

import grpc

from libra import types as t
from libra.clients.api import SchedulerClientApi as SchedulerClientApi
from libra.clients.base import GrpcClientBase
from libra.errors import Internal, LibraError, Unavailable
from libra.grpc_auth import ClientAuth
from libra.proto.scheduler.v1 import scheduler_pb2 as spb
from libra.proto.scheduler.v1 import scheduler_pb2_grpc as spb_grpc
from libra.retry import Sleep
from libra.wire.common import traj_status_to_proto
from libra.wire.scheduler import (
    decision_from_proto,
    error_from_text,
    report_to_proto,
    stats_from_proto,
)

# Reports per batch at most (a larger queue goes out in several batches).
MAX_REPORTS_PER_BATCH = 256
# All-stay batches in a row the scheduler may leave unanswered (0: answer every batch).
MAX_UNANSWERED_BATCHES = 8
# The reason of a stay that was settled by a later answer, not answered itself.
IMPLIED_STAY = "stay_implied"


@dataclass
class _Queued:
    report: spb.ToolReturnReport
    future: asyncio.Future[t.PlacementDecision]
    needs_answer: bool


@dataclass
class _Batch:
    """A batch on the stream, not answered yet; ``answered`` is set once it is settled."""

    batch_id: int
    items: list[_Queued]
    answered: asyncio.Future[None]


class GrpcSchedulerClient(GrpcClientBase):
    """The scheduler over gRPC: job start and stop, and the tool-return reports, batched
    onto one long-lived stream per instance (see the module docstring)."""

    def __init__(self, address: str, timeout_s: float = 10.0, linger_s: float = 0.0,
                 max_unanswered: int = MAX_UNANSWERED_BATCHES, *,
                 auth: ClientAuth | None = None, sleep: Sleep = asyncio.sleep) -> None:
        super().__init__(address, timeout_s, auth=auth)
        self._linger_s = linger_s
        self._sleep = sleep  # the linger's wait (tests end it when they choose)
        self._max_unanswered = max_unanswered
        self._stub = spb_grpc.SchedulerServiceStub(self._channel)
        self._queue: dict[tuple[str, int], list[_Queued]] = {}
        self._sender: asyncio.Task[None] | None = None
        self._stream: Any = None  # grpc.aio.StreamStreamCall, opened with the first batch
        self._reader: asyncio.Task[None] | None = None  # takes the stream's answers
        self._unanswered: deque[_Batch] = deque()  # written, in batch_id order
        # Set when answers shrink ``_unanswered``: the sender waits on it at a full window.
        self._room: asyncio.Future[None] | None = None
        self._batch_ids = itertools.count(1)
        # Reports made, the batches written that carried them, the answers those got and
        # the streams opened for them (benchmarks, tests).
        self.num_reports = 0
        self.num_report_batches = 0
        self.num_report_answers = 0
        self.num_report_streams = 0

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Schedule a job; ``resume``: it ran before and ended (its assigned trajectories
        are re-queued, admission continues from its counters)."""
        await self._call(self._stub.StartJob, spb.StartJobRequest(job_id=job_id,
                                                                  resume=resume))

    async def stop_job(self, job_id: str) -> None:
        """Stop admitting and placing the job's work (what the store holds stays)."""
        await self._call(self._stub.StopJob, spb.StopJobRequest(job_id=job_id),
                         idempotent=True)

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision:
        """The scheduler's decision for one tool return (sent batched with others).

        Without ``needs_answer`` a stay is known only once a later batch is answered
        (within ``max_unanswered`` batches, or when the client closes): for callers that
        go on at once and act only on a MOVE."""
        future: asyncio.Future[t.PlacementDecision] = asyncio.get_running_loop().create_future()
        report = report_to_proto(t.ToolReturnReport(job_id, trajectory_id, state,
                                                    tokens_so_far))
        self._queue.setdefault((instance_id, lease_epoch), []).append(
            _Queued(report, future, needs_answer))
        self.num_reports += 1
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_queued())
        return await future

    async def _send_queued(self) -> None:
        # Let reports raised in the same loop iteration (or within the linger) join.
        await self._sleep(self._linger_s)
        while self._queue:
            (instance_id, epoch), items = next(iter(self._queue.items()))
            batch, rest = items[:MAX_REPORTS_PER_BATCH], items[MAX_REPORTS_PER_BATCH:]
            if rest:
                self._queue[(instance_id, epoch)] = rest
            else:
                del self._queue[(instance_id, epoch)]
            await self._send_batch(instance_id, epoch, batch)

    async def _send_batch(self, instance_id: str, epoch: int, items: list[_Queued]) -> None:
        batch = _Batch(next(self._batch_ids), items, asyncio.get_running_loop().create_future())
        request = spb.ReportToolReturnsRequest(
            instance_id=instance_id, lease_epoch=epoch, reports=[q.report for q in items],
            batch_id=batch.batch_id, answer_stays=any(q.needs_answer for q in items),
            max_unanswered=self._max_unanswered)
        try:
            async with asyncio.timeout(self._timeout_s):  # no task per batch (wait_for)
                stream = self._open_stream()
                self._unanswered.append(batch)
                await stream.write(request)
                # Counted once written: a close after this point finds the batch out,
                # to be answered as the stream ends (before it, the batch is not sent).
                self.num_report_batches += 1
                # An answer is due where asked for, and within the window once it is
                # full: it comes before the next batch goes, or the stream is broken.
                if request.answer_stays:
                    await batch.answered
                while len(self._unanswered) > self._max_unanswered:
                    self._room = asyncio.get_running_loop().create_future()
                    await self._room
        except (Exception, asyncio.CancelledError) as exc:
            # The stream's state is unknown now (an answer may still come): start over.
            self._drop_stream(_stream_error(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise

    def _open_stream(self) -> Any:
        """The stream, opened on first use or again after it ended (no deadline: it
        lives as long as the client), with its reader."""
        if self._stream is None or self._stream.done():  # ended while idle: replace it
            self._drop_stream(Unavailable("the tool-return stream ended"))
            self._stream = self._stub.ToolReturns()
            self._reader = asyncio.create_task(self._read_answers(self._stream))
            self.num_report_streams += 1
        return self._stream

    async def _read_answers(self, stream: Any) -> None:
        try:
            while True:
                resp = await stream.read()
                if resp is grpc.aio.EOF:
                    raise Unavailable("the scheduler closed the tool-return stream")
                self._take_answer(resp)
        except Exception as exc:
            if stream is self._stream:
                self._reader = None  # ending by itself: nothing to cancel
                self._drop_stream(_stream_error(exc))

    def _take_answer(self, resp: spb.ReportToolReturnsResponse) -> None:
        """Settle the batch answered, and every earlier one as all stays; an answer
        that breaks the protocol ends the stream like a broken one."""
        out = self._unanswered
        if not out or not out[0].batch_id <= resp.batch_id <= out[-1].batch_id:
            raise Internal(f"answer to batch {resp.batch_id}, which is not out")
        while out[0].batch_id < resp.batch_id:
            _settle_batch(out.popleft())
        batch = out.popleft()
        self.num_report_answers += 1
        if resp.error:
            _settle_batch(batch, error=error_from_text(resp.error))
        elif len(resp.decisions) != len(batch.items):
            error = Internal(f"{len(resp.decisions)} decisions for {len(batch.items)} reports")
            _settle_batch(batch, error=error)
            raise error
        else:
            _settle_batch(batch, [decision_from_proto(d) for d in resp.decisions])
        self._make_room()

    def _make_room(self) -> None:
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def _drop_stream(self, error: LibraError) -> None:
        """Give the stream up: every unanswered batch fails with ``error``."""
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        if self._reader is not None:
            self._reader.cancel()
        self._reader = None
        while self._unanswered:
            _settle_batch(self._unanswered.popleft(), error=error)
        self._make_room()

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
        """The job's placement figures: policy, pending work, decisions, migrations."""
        resp = await self._call(self._stub.GetSchedulerStats,
                                spb.GetSchedulerStatsRequest(job_id=job_id), idempotent=True)
        return stats_from_proto(resp)

    async def close(self) -> None:
        """Stop the sender, fail the reports not yet sent, end the report stream and close the
        channel."""
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for items in self._queue.values():
            for q in items:
                _settle(q.future, exc=LibraError("scheduler client closed"))
        self._queue.clear()
        try:
            if self._stream is not None and self._reader is not None:
                # Ending our side makes the scheduler answer the last batch, which
                # settles the stays still unanswered; the reader ends with the stream.
                reader = self._reader
                try:
                    async with asyncio.timeout(self._timeout_s):
                        await self._stream.done_writing()
                        await reader
                except Exception:
                    pass  # what is still unanswered fails below
        finally:
            self._drop_stream(LibraError("scheduler client closed"))
        await super().close()


def _settle_batch(batch: _Batch,
                  decisions: list[t.PlacementDecision | LibraError] | None = None,
                  error: LibraError | None = None) -> None:
    """Settle every report of a batch: with its decision (or that item's error), with
    ``error``, or (neither given) as a stay that a later answer implied."""
    implied = t.PlacementDecision(t.DecisionAction.STAY, reason=IMPLIED_STAY)
    for i, q in enumerate(batch.items):
        outcome = error or (decisions[i] if decisions is not None else implied)
        if isinstance(outcome, LibraError):
            _settle(q.future, exc=outcome)
        else:
            _settle(q.future, outcome)
    if not batch.answered.done():
        batch.answered.set_result(None)


def _stream_error(exc: BaseException) -> LibraError:
    if isinstance(exc, LibraError):
        return exc
    if isinstance(exc, grpc.aio.AioRpcError):
        # The stream itself failed, not a batch (a refusal comes as an answer): the
        # scheduler is unreachable, whichever status the transport chose (UNAVAILABLE,
        # or INTERNAL when the connection drops as the call starts).
        return Unavailable(f"tool-return stream failed: {exc.code().name}: {exc.details()}")
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
