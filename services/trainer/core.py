"""Trainer core: async GRPO on complete groups, with bounded staleness (pure).

One job at a time. ``start_job`` returns at once; the job runs as a task:
warm start (supervised, on the job's demonstrations) -> publish version 0 -> steps.
Each step (1) collects ``prompts_per_step`` complete groups from the trajectory stream,
dropping what is too stale or failed, (2) trains on them, (3) acknowledges the entries
and counts them, (4) publishes a new policy version every ``sync_interval`` steps,
(5) writes a checkpoint every ``checkpoint_interval`` steps and (6) reports the step
record to the coordinator. Eval trajectories (``task.eval_interval``) met in the stream
are routed to their rounds (evaluation.py), never into a batch; after the last step
the job waits, bounded, for the final eval round.

Reports to the coordinator (steps, the job's end) go through ``CoordinatorReporter``
(``reports.py``): retried with backoff while it is unreachable and keyed, so a
coordinator restart only delays the step loop and never fails the job.

Resume (:meth:`TrainerCore.resume`, called at start-up; ``start_job(resume=True)`` from
the coordinator's reconciliation or its ResumeJob of a cancelled or failed job): the job
lost its trainer, so it restarts from the newest checkpoint (model, optimizer, RNG, step) instead
of the warm start. Redis kept the rest: entries delivered but not acked are re-read
(pending), and trajectories acked since the checkpoint are in the idempotency set, so
they are never trained again. Their step's effect on the weights is lost and the step
counter goes back to the checkpoint's, so those steps are redone on new data; the
accounting (produced = trained + dropped + in flight) stays exact. The first version
published after a resume is one above the last one in Redis, never a reused number:
rollout instances only load versions newer than theirs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from libra import types as t
from libra.clock import Clock
from libra.errors import FailedPrecondition, NotFound
from libra.jobspec import JobSpec, job_spec_from_json
from libra.retry import RetryPolicy, Sleep
from libra.rewardspec import RewardSpec
from libra.training import channel as ch
from services.trainer import trace_spans
from services.trainer.backend_protocol import Backend, BackendFactory
from services.trainer.batch_collector import Batch, BatchCollector
from services.trainer.elastic import GradientDomain, HybridSession
from services.trainer.elastic_step import ElasticTrainer
from services.trainer.evaluation import EvalRouter
from services.trainer.failures import JobFailure, RewardFailureBudget, component_means
from services.trainer.grpo import GroupBuffer, to_samples
from services.trainer.policy_init import PolicyInitializer
from services.trainer.publishing import WeightPublisher
from services.trainer.reports import CoordinatorReporter

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from libra.clients.api import CoordinatorApi
    from services.trainer.store_protocol import TrainerStore

logger = logging.getLogger(__name__)

# How long stop_job waits for the cancelled training task (it answers an RPC).
STOP_TIMEOUT_S = 5.0
# How long a start waits for the previous job's task to send its job-done report.
END_REPORT_WAIT_S = 10.0
# How often a stop delivers the cancellation again while the task has not ended.
CANCEL_REPEAT_S = 0.2

# Counter-field prefix of the scheduler's per-bucket placements (``placed:<bucket>``).
_PLACED = "placed:"


class TrainerCore:
    """Runs one job's training loop."""

    def __init__(self, store: TrainerStore, factory: BackendFactory,
                 coordinator: CoordinatorApi, clock: Clock, consumer: str = "trainer-0",
                 block_ms: int = 200, report_retry: RetryPolicy | None = None,
                 sleep: Sleep = asyncio.sleep,
                 weight_pins: Callable[[str], set[int]] | None = None) -> None:
        self._store = store
        self._factory = factory
        self._coordinator = coordinator
        self._clock = clock
        self._consumer = consumer
        self._block_ms = block_ms
        self._reports = CoordinatorReporter(coordinator, clock, report_retry, sleep)
        self._publisher = WeightPublisher(store, clock, weight_pins)
        self._task: asyncio.Task | None = None
        self._cleaning_up = False  # the job's task is in its final cleanup
        # Set by a stop: the warm start (minutes in a thread that cancellation cannot
        # reach) checks it before every SFT step.
        self._stop_requested = threading.Event()
        # Set while a job with elastic.enabled trains: the hybrids' gradient domain.
        self._elastic: ElasticTrainer | None = None
        # The job's eval rounds in progress (evaluation.py); set per job.
        self._evals: EvalRouter | None = None
        self.job_id = ""
        self.phase = "idle"
        self.step = 0
        self.policy_version = -1
        self.message = ""  # how the last job ended here (phase done or failed)
        self._failures = RewardFailureBudget(RewardSpec())

    def status(self) -> t.TrainerStatus:
        """What ``libra status`` shows of the trainer: job, phase, step, policy version."""
        return t.TrainerStatus(job_id=self.job_id, phase=self.phase, step=self.step,
                               policy_version=self.policy_version, message=self.message)

    async def start_job(self, job_id: str, resume: bool = False) -> None:
        """Start training a job; ``resume`` continues from its newest checkpoint."""
        if self._task is not None and not self._task.done() and self.phase in ("done",
                                                                                "failed"):
            # The last job ended and its task is sending the job-done report, on which
            # the coordinator starts the next queued job: let the report finish.
            await asyncio.wait({self._task}, timeout=END_REPORT_WAIT_S)
        if self._task is not None and not self._task.done():
            raise FailedPrecondition(f"trainer is busy with job {self.job_id}")
        spec_json = await self._store.job_spec_json(job_id)
        if spec_json is None:
            raise NotFound(f"job {job_id!r} not found")
        self.job_id, self.phase, self.step, self.policy_version = job_id, "warmup", 0, -1
        self.message = ""
        spec = job_spec_from_json(spec_json)  # once: the run gets it typed
        self._failures = RewardFailureBudget(spec.reward)
        self._reports.new_run()
        self._cleaning_up = False
        self._stop_requested = threading.Event()
        self._task = asyncio.create_task(
            self._run_job(job_id, spec, resume))

    async def resume(self) -> list[str]:
        """Take up a job that is RUNNING without a trainer (this process restarted)."""
        running = await self._store.running_jobs()
        for job_id in running[:1]:  # one job at a time
            logger.info("[resume] job_id=%s", job_id)
            await self.start_job(job_id, resume=True)
        return running[:1]

    async def stop_job(self, job_id: str) -> None:
        """Cancel the job's training task if it runs here (cancel, failure, another job)."""
        if self.job_id == job_id and self._task is not None and not self._task.done():
            await self._cancel_task()
            self.phase = "idle"

    async def drain(self, _grace_s: float) -> None:
        """Cancel the running job on SIGTERM; its newest checkpoint is what a resume uses."""
        if self._task is not None:
            await self._cancel_task()

    async def _cancel_task(self) -> None:
        """Cancel the job's task and wait for it, but never longer than STOP_TIMEOUT_S:
        the caller is an RPC with a deadline. The cancellation is repeated every
        CANCEL_REPEAT_S until the task reaches its cleanup: under load one was seen lost
        inside redis-py (the task went on reading the stream and trained a step after
        its stop, one its successor trained again). A repeat never interrupts cleanup."""
        assert self._task is not None
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + STOP_TIMEOUT_S
        self._stop_requested.set()
        self._task.cancel()
        while not self._task.done() and (left_s := deadline_s - loop.time()) > 0:
            await asyncio.wait({self._task}, timeout=min(CANCEL_REPEAT_S, left_s))
            if not self._task.done() and not self._cleaning_up:
                logger.warning("[job] cancellation lost, repeating job_id=%s", self.job_id)
                self._task.cancel()
        if not self._task.done():
            logger.error("[job] training task still running %.0fs after cancel job_id=%s "
                         "awaiting=%s", STOP_TIMEOUT_S, self.job_id,
                         _await_chain(self._task.get_coro()))

    def connect_hybrid(self, hello: ch.Hello) -> HybridSession:
        """A lent rollout worker opened the gradient channel (see elastic.py)."""
        if self._elastic is None or hello.job_id != self.job_id or self.phase != "training":
            raise FailedPrecondition(
                f"no elastic job is training here for job_id={hello.job_id!r} "
                f"(trainer job {self.job_id!r}, phase {self.phase})")
        try:
            return self._elastic.connect_hybrid(hello)
        except ValueError as exc:
            raise FailedPrecondition(str(exc)) from exc

    def elastic_message(self, session: HybridSession, msg: ch.HybridMessage) -> None:
        """A lent worker's message on the gradient channel (applied, activated, gradients)."""
        if self._elastic is not None:
            self._elastic.elastic_message(session, msg)

    def disconnect_hybrid(self, session: HybridSession, reason: str) -> None:
        """A lent worker left the gradient channel; the elastic step goes on without it."""
        if self._elastic is not None:
            self._elastic.disconnect_hybrid(session, reason)

    async def wait(self) -> None:
        """Wait until the job's task ends (tests and the in-process loop)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run_job(self, job_id: str, spec: JobSpec, resume: bool) -> None:
        try:
            await self._train(job_id, spec, resume)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.phase = "failed"
            self.message = str(exc) if isinstance(exc, JobFailure) else (
                f"trainer: {exc}")
            logger.exception("[job] training failed job_id=%s", job_id)
            await self._reports.report_job_done(job_id, t.JobState.FAILED, self.message)
            return
        self.phase, self.message = "done", f"trained {self.step} steps"
        await self._reports.report_job_done(job_id, t.JobState.SUCCEEDED, self.message)

    async def _train(self, job_id: str, spec: JobSpec, resume: bool) -> None:
        run_dir = Path(await self._store.job_run_dir(job_id))
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        model_dir = str(run_dir / "model")
        backend = await asyncio.to_thread(self._factory.create, spec, model_dir)
        if spec.elastic.enabled:
            self._elastic = self._elastic_trainer(job_id, spec, backend, run_dir)
        try:
            await self._train_with(job_id, spec, resume, backend, run_dir, model_dir)
        finally:
            self._cleaning_up = True
            if self._elastic is not None:
                self._elastic.close("job ended")
                self._elastic = None
            # A data-parallel backend owns worker processes and a process group.
            close = getattr(backend, "close", None)
            if close is not None:
                await asyncio.to_thread(close)

    async def _train_with(self, job_id: str, spec: JobSpec, resume: bool, backend: Backend,
                          run_dir: Path, model_dir: str) -> None:
        init = PolicyInitializer(self._store, self._reports, self._stop_requested.is_set,
                                 self._set_step)
        self.step, version = await init.init(job_id, spec, backend, run_dir, resume)
        await self._store.ensure_group(job_id)
        await self._publish(job_id, backend, run_dir, model_dir, version)
        self.phase = "training"
        evals = self._evals = EvalRouter(job_id, spec, self._store, self._clock,
                                         self._consumer, self._block_ms)
        collector = BatchCollector(self._store, job_id, spec, self._consumer, self._block_ms,
                                   self._failures, evals, lambda: self.policy_version,
                                   self._clock)
        buffer = GroupBuffer(spec.algorithm.samples_per_prompt)
        first = True
        placements = await self._store.counters(job_id)
        a = spec.algorithm
        while self.step < a.num_steps:
            started = time.perf_counter()
            if self._elastic is not None:  # join states move at step boundaries only
                await self._elastic.boundary(self.step, self.policy_version)
            # 1) Complete, fresh groups (re-delivered pending entries first).
            batch = await collector.collect(buffer, pending=first)
            first = False
            # 2) Train, ack and count.
            fields = await self._train_on(job_id, spec, backend, batch)
            placements, placement_fields = await self._placement_deltas(job_id, placements)
            fields.update(placement_fields)
            # 3) Publish every sync_interval steps, checkpoint every checkpoint_interval.
            if (self.step + 1) % a.sync_interval == 0:
                fields["publish_s"] = await self._publish(job_id, backend, run_dir, model_dir,
                                                          self.policy_version + 1)
                fields["weights_pruned"] = await self._publisher.prune(
                    job_id, run_dir, a.keep_weight_versions)
            self.step += 1
            record = t.StepRecord(step=self.step, policy_version=self.policy_version,
                                  wall_s=round(time.perf_counter() - started, 4), **fields)
            if a.checkpoint_interval and self.step % a.checkpoint_interval == 0:
                key = self._reports.step_key(job_id, self.step)
                record = replace(record, checkpoint_s=await self._publisher.checkpoint(
                    backend, run_dir, self.policy_version, record, key))
            # 4) Report the step.
            # Retried while the coordinator is away: a restart of it delays, never fails.
            await self._reports.report_step(job_id, record)
        # 5) The job ends once the final eval round is recorded (bounded).
        await evals.wait_final()

    def _set_step(self, step: int) -> None:
        self.step = step

    async def _publish(self, job_id: str, backend: Backend, run_dir: Path, model_dir: str,
                       version: int) -> float:
        """Write and announce a version (now the trainer's); returns the seconds it took."""
        seconds = await self._publisher.publish(job_id, backend, run_dir, model_dir, version)
        self.policy_version = version
        return seconds

    def _elastic_trainer(self, job_id: str, spec: JobSpec, backend: Backend,
                         run_dir: Path) -> ElasticTrainer:
        if getattr(backend, "num_ranks", 1) > 1:
            # Hybrids merge into rank 0's gradient; with a DDP group the other ranks
            # would step without them. One rank only, said at start rather than mid-run.
            raise FailedPrecondition("elastic.enabled needs trainer.num_ranks == 1")

        async def record(kind: str, **fields: str) -> None:
            await self._store.record_event(job_id, kind, **fields)

        domain = GradientDomain(self._clock, record)
        return ElasticTrainer(spec, spec.to_json(), backend, run_dir, domain,  # type: ignore[arg-type]
                              self._coordinator, record)

    async def _train_on(self, job_id: str, spec: JobSpec, backend: Backend,
                        batch: Batch) -> dict[str, Any]:
        """Train on the batch, ack and count it; returns the step record's fields so far."""
        trajs = [tr for _, tr in batch.entries]
        samples = to_samples(trajs)
        started, started_ms = time.perf_counter(), self._clock.now_ms()
        hybrids = {"hybrid_workers": 0, "hybrid_joining": 0}
        if self._elastic is None:
            metrics = await asyncio.to_thread(backend.train_step, samples)
        else:
            hybrids = {"hybrid_workers": len(self._elastic.domain.active()),
                       "hybrid_joining": len(self._elastic.domain.joining())}
            metrics = await self._elastic.train(samples, self.step + 1)
        train_s = time.perf_counter() - started
        if metrics.get("is_skipped"):
            # Non-finite loss or gradient: the weights were left untouched.
            logger.warning("[train] step skipped (non-finite) job_id=%s step=%d", job_id,
                           self.step + 1)
            await self._store.record_event(job_id, "step_skipped_nonfinite",
                                           step=str(self.step + 1))
        await self._store.consume(job_id, [e for e, _ in batch.entries],
                                  [tr.trajectory_id for tr in trajs], trained=len(trajs),
                                  trained_groups=spec.algorithm.prompts_per_step)
        trace_spans.trained(job_id, self.step + 1, self.policy_version, trajs, started_ms,
                            self._clock.now_ms())
        rewards = [tr.reward for tr in trajs]
        return {"reward_mean": sum(rewards) / len(rewards), "num_trajectories": len(trajs),
                # > num_trajectories when split episodes brought earlier segments.
                "num_sequences": len(samples),
                "rollout_s": round(batch.wait_s, 4), "train_s": round(train_s, 4),
                "dropped_stale": batch.dropped_stale, "dropped_failed": batch.dropped_failed,
                "reward_components": component_means(trajs),
                "turns_mean": sum(tr.num_turns for tr in trajs) / len(trajs),
                "tokens_mean": sum(tr.num_generated_tokens for tr in trajs) / len(trajs),
                **hybrids,
                "metrics": {k: round(float(v), 6) for k, v in metrics.items()}}

    async def _placement_deltas(self, job_id: str, before: dict[str, int]
                                ) -> tuple[dict[str, int], dict[str, Any]]:
        """Scheduler activity during the step, from the cumulative counters it keeps:
        ``migrations`` and ``bucket_occupancy`` (bucket -> trajectories placed there,
        moves in included). Returns the counters now and the step-record keys."""
        now = await self._store.counters(job_id)
        occupancy = {name.removeprefix(_PLACED): value - before.get(name, 0)
                     for name, value in sorted(now.items()) if name.startswith(_PLACED)}
        return now, {"migrations": now.get("migrations", 0) - before.get("migrations", 0),
                     "bucket_occupancy": occupancy}


def _await_chain(coro: Any) -> str:
    """Where a coroutine waits, outermost first ("file:line function" per frame): a
    task's ``get_stack`` shows only its outermost frame."""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " -> ".join(frames)
