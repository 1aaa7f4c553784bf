"""The trainer's reports to the coordinator (step records, the job's end), retried
across a coordinator restart (pure: the client, clock and sleep are injected).

Each report is retried with backoff while the coordinator is unreachable (``policy``:
up to 10 minutes by default), so a coordinator restart only delays the step loop and
never fails the job. Step reports carry an idempotency key - job, step and the run's
token (one per ``start_job``) - so a retry whose first try was applied before its reply
was lost is recognised by the coordinator, and a step redone after a resume (a new
token) replaces its record instead of adding a second one. Job-done reports are keyed
by job + outcome on the coordinator's side: once the job is terminal a repeat changes
nothing.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from libra import types as t
from libra.clock import Clock
from libra.errors import LibraError
from libra.ids import new_run_token
from libra.retry import RetryPolicy, Sleep, retry_transient

if TYPE_CHECKING:  # the client's type only: no grpc at run time
    from libra.clients.api import CoordinatorApi

logger = logging.getLogger(__name__)


class CoordinatorReporter:
    """Sends one trainer's reports; ``new_run`` starts a new idempotency-key space."""

    def __init__(self, coordinator: CoordinatorApi, clock: Clock,
                 policy: RetryPolicy | None = None, sleep: Sleep = asyncio.sleep) -> None:
        self._coordinator = coordinator
        self._clock = clock
        self._policy = policy or RetryPolicy()
        self._sleep = sleep
        self._run_token = new_run_token()

    def new_run(self) -> None:
        """A new run of a job (start or resume): its steps get new keys."""
        self._run_token = new_run_token()

    def step_key(self, job_id: str, step: int) -> str:
        return f"{job_id}:{step}:{self._run_token}"

    async def report_step(self, job_id: str, record: t.StepRecord, key: str = "") -> None:
        """Report a step until the coordinator takes it (raises the last error once the
        policy gives up, or at once for a non-retryable one). ``key`` defaults to this
        run's key of the step; a resume passes the key the step was first sent with."""
        key = key or self.step_key(job_id, record.step)
        await retry_transient(f"report_step job_id={job_id} step={record.step}",
                              lambda: self._coordinator.report_step(job_id, record, key),
                              self._policy, self._clock, self._sleep)

    async def report_job_done(self, job_id: str, state: t.JobState, message: str) -> bool:
        """Report the job's end; False (logged) when the coordinator could not be told.

        The coordinator's reconciliation then reads the outcome from the trainer's
        status (phase and message) instead.
        """
        try:
            await retry_transient(
                f"report_job_done job_id={job_id}",
                lambda: self._coordinator.report_job_done(job_id, state, message),
                self._policy, self._clock, self._sleep)
        except LibraError as exc:
            logger.error("[job] could not report end job_id=%s state=%s error=%s", job_id,
                         state.value, exc)
            return False
        return True
