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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from libra import types as t
from libra.clock import Clock
from libra.errors import FailedPrecondition, NotFound
from libra.jobspec import JobSpec, job_spec_from_json
from libra.retry import RetryPolicy, Sleep
from libra.rewardspec import RewardSpec
from libra.run_dir import prune_weight_versions, resolve_init_from, weights_file
from libra.training import channel as ch
from libra.training.samples import TrainSample
from libra.weight_sync import write_manifest
from services.trainer import checkpoint
from services.trainer.elastic import GradientDomain, HybridSession
from services.trainer.elastic_step import ElasticTrainer
from services.trainer.evaluation import EvalRouter
from services.trainer.failures import JobFailure, RewardFailureBudget, component_means
from services.trainer.grpo import GroupBuffer, group_advantages, staleness
from services.trainer.reports import CoordinatorReporter

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from libra.clients.coordinator import CoordinatorApi
    from services.trainer.store import TrainerStore

logger = logging.getLogger(__name__)

# How long stop_job waits for the cancelled training task (it answers an RPC).
STOP_TIMEOUT_S = 5.0
# How long a start waits for the previous job's task to send its job-done report.
END_REPORT_WAIT_S = 10.0
# How often a stop delivers the cancellation again while the task has not ended.
CANCEL_REPEAT_S = 0.2

# Counter-field prefix of the scheduler's per-bucket placements (``placed:<bucket>``).
_PLACED = "placed:"


class Backend(Protocol):
    def warm_start(self, should_stop: Callable[[], bool] = ...) -> dict[str, float]: ...

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]: ...

    def save_weights(self, path: str) -> str: ...

    def save_checkpoint(self, directory: str) -> list[str]: ...

    def load_checkpoint(self, directory: str) -> None: ...

    def load_model_weights(self, checkpoint_dir: str) -> None: ...


class BackendFactory(Protocol):
    def create(self, spec: JobSpec, model_dir: str) -> Backend: ...


@dataclass
class _Batch:
    entries: list[tuple[str, t.Trajectory]]
    dropped_stale: int
    dropped_failed: int
    dropped_groups: int
    wait_s: float


class TrainerCore:
    """Runs one job's training loop."""

    def __init__(self, store: TrainerStore, factory: BackendFactory,
                 coordinator: CoordinatorApi, clock: Clock, consumer: str = "trainer-0",
                 block_ms: int = 200, report_retry: RetryPolicy | None = None,
                 sleep: Sleep = asyncio.sleep) -> None:
        self._store = store
        self._factory = factory
        self._coordinator = coordinator
        self._clock = clock
        self._consumer = consumer
        self._block_ms = block_ms
        self._reports = CoordinatorReporter(coordinator, clock, report_retry, sleep)
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
        self._failures = RewardFailureBudget(job_spec_from_json(spec_json).reward)
        self._reports.new_run()
        self._cleaning_up = False
        self._stop_requested = threading.Event()
        self._task = asyncio.create_task(
            self._run_job(job_id, job_spec_from_json(spec_json), resume))

    async def resume(self) -> list[str]:
        """Take up a job that is RUNNING without a trainer (this process restarted)."""
        running = await self._store.running_jobs()
        for job_id in running[:1]:  # one job at a time
            logger.info("[resume] job_id=%s", job_id)
            await self.start_job(job_id, resume=True)
        return running[:1]

    async def stop_job(self, job_id: str) -> None:
        if self.job_id == job_id and self._task is not None and not self._task.done():
            await self._cancel_task()
            self.phase = "idle"

    async def drain(self, _grace_s: float) -> None:
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
        if self._elastic is not None:
            self._elastic.elastic_message(session, msg)

    def disconnect_hybrid(self, session: HybridSession, reason: str) -> None:
        if self._elastic is not None:
            self._elastic.disconnect_hybrid(session, reason)

    async def wait(self) -> None:
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
        version = await self._init_policy(job_id, spec, backend, run_dir, resume)
        await self._store.ensure_group(job_id)
        await self._publish(job_id, backend, run_dir, model_dir, version)
        self.phase = "training"
        evals = self._evals = EvalRouter(job_id, spec, self._store, self._clock,
                                         self._consumer, self._block_ms)
        buffer = GroupBuffer(spec.algorithm.samples_per_prompt)
        first = True
        placements = await self._store.counters(job_id)
        a = spec.algorithm
        while self.step < a.num_steps:
            started = time.perf_counter()
            if self._elastic is not None:  # join states move at step boundaries only
                await self._elastic.boundary(self.step, self.policy_version)
            # 1) Complete, fresh groups (re-delivered pending entries first).
            batch = await self._collect(job_id, spec, buffer, pending=first)
            first = False
            # 2) Train, ack and count.
            record = await self._train_on(job_id, spec, backend, batch)
            placements, placement_record = await self._placement_deltas(job_id, placements)
            record.update(placement_record)
            # 3) Publish every sync_interval steps, checkpoint every checkpoint_interval.
            if (self.step + 1) % a.sync_interval == 0:
                record["publish_s"] = await self._publish(job_id, backend, run_dir, model_dir,
                                                          self.policy_version + 1)
                record["weights_pruned"] = await self._prune_weights(job_id, run_dir,
                                                                     a.keep_weight_versions)
            self.step += 1
            record.update(step=self.step, policy_version=self.policy_version,
                          wall_s=round(time.perf_counter() - started, 4))
            if a.checkpoint_interval and self.step % a.checkpoint_interval == 0:
                record["checkpoint_s"] = await self._checkpoint(job_id, backend, run_dir,
                                                                record)
            # 4) Report the step.
            # Retried while the coordinator is away: a restart of it delays, never fails.
            await self._reports.report_step(job_id, record)
        # 5) The job ends once the final eval round is recorded (bounded).
        await evals.wait_final()

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

    async def _init_policy(self, job_id: str, spec: JobSpec, backend: Backend, run_dir: Path,
                           resume: bool) -> int:
        """Warm start (after ``init_from``'s weights), or load the newest checkpoint;
        returns the version to publish."""
        ckpt = None
        if resume:
            ckpt = await asyncio.to_thread(checkpoint.latest, run_dir / "checkpoints")
        if ckpt is None:
            await self._load_init_from(job_id, spec, backend, run_dir)
            warm = await asyncio.to_thread(backend.warm_start, self._stop_requested.is_set)
            logger.info("[warmup] done job_id=%s %s", job_id, warm)
        else:
            await asyncio.to_thread(backend.load_checkpoint, str(ckpt.path))
            self.step = ckpt.step
            logger.info("[resume] from checkpoint job_id=%s step=%d path=%s", job_id,
                        ckpt.step, ckpt.path)
            if ckpt.step_report is not None:  # a repeat if it was delivered (same key)
                await self._reports.report_step(job_id, ckpt.step_report["record"],
                                                ckpt.step_report["key"])
        if not resume:
            return 0
        # Never reuse a version number: rollout instances load only newer versions.
        last = await self._store.policy_version(job_id)
        await self._store.record_event(job_id, "trainer_resumed", step=str(self.step),
                                       checkpoint=str(ckpt.path) if ckpt else "")
        return max(last, ckpt.policy_version if ckpt else -1) + 1

    async def _load_init_from(self, job_id: str, spec: JobSpec, backend: Backend,
                              run_dir: Path) -> None:
        """``algorithm.init_from``: another job's model weights, nothing else (fresh
        optimizer, step 0). Resolved now, not at submit: a job id gives that job's
        newest checkpoint at this start. Job run dirs share the run root."""
        if not spec.algorithm.init_from:
            return
        ckpt = await asyncio.to_thread(resolve_init_from, spec.algorithm.init_from,
                                       run_dir.parent)
        await asyncio.to_thread(backend.load_model_weights, str(ckpt.path))
        logger.info("[init_from] job_id=%s checkpoint=%s step=%d", job_id, ckpt.path, ckpt.step)
        await self._store.record_event(job_id, "init_from", checkpoint=str(ckpt.path),
                                       step=str(ckpt.step))

    async def _prune_weights(self, job_id: str, run_dir: Path, keep: int) -> int:
        """Delete published versions beyond the newest ``keep`` that no live rollout
        instance holds or fetches; returns how many went."""
        if keep == 0:
            return 0
        in_use = await self._store.weights_in_use(job_id)
        pruned = await asyncio.to_thread(prune_weight_versions, run_dir, keep, in_use)
        if pruned:
            logger.info("[weights] pruned job_id=%s versions=%s kept_in_use=%s", job_id,
                        pruned, sorted(in_use))
        return len(pruned)

    async def _checkpoint(self, job_id: str, backend: Backend, run_dir: Path,
                          record: dict[str, Any]) -> float:
        """Write the checkpoint of ``self.step`` with the step's report (sent again at a
        resume: a stop between this write and the report would lose the record)."""
        started = time.perf_counter()
        report = {"record": dict(record), "key": self._reports.step_key(job_id, self.step)}
        ckpt = await asyncio.to_thread(checkpoint.save, run_dir / "checkpoints", self.step,
                                       self.policy_version, backend.save_checkpoint,
                                       step_report=report)
        logger.info("[checkpoint] step=%d path=%s", self.step, ckpt.path)
        return round(time.perf_counter() - started, 4)

    async def _collect(self, job_id: str, spec: JobSpec, buffer: GroupBuffer,
                       pending: bool) -> _Batch:
        """Read the stream until ``prompts_per_step`` complete, fresh groups are in hand."""
        started = time.perf_counter()
        batch = _Batch([], 0, 0, 0, 0.0)
        need = spec.algorithm.prompts_per_step
        while True:
            while len(buffer.complete()) < need:
                entries = await self._store.read(job_id, self._consumer, 64, self._block_ms,
                                                 pending=pending)
                pending = False
                await self._admit(job_id, spec, buffer, entries, batch)
            # Members admitted under an older policy may have gone stale while their
            # group filled up: check again right before training.
            stale = [g for g in buffer.complete() if any(
                staleness(self.policy_version, tr) > spec.algorithm.max_staleness
                for _, tr in buffer.groups[g])]
            if not stale:
                break
            for group_id in stale:
                await self._drop_group(job_id, buffer, group_id, "dropped_stale", batch)
        batch.entries = buffer.take(sorted(buffer.complete())[:need])
        batch.wait_s = time.perf_counter() - started
        return batch

    async def _admit(self, job_id: str, spec: JobSpec, buffer: GroupBuffer,
                     entries: list[tuple[str, t.Trajectory]], batch: _Batch) -> None:
        """Sort new entries into the buffer; duplicates, stale and failed ones are acked
        and counted (a dropped member breaks its whole group), never trained on. Eval
        trajectories go to their rounds instead (never into a batch)."""
        if self._evals is not None:
            entries = await self._evals.take(entries)
        ids = [tr.trajectory_id for _, tr in entries]
        seen = await self._store.already_consumed(job_id, ids)
        # Ids held in the buffer or met earlier in this read are duplicates too: they are
        # not in the consumed set yet, and their second entry must still be acked.
        held = {tr.trajectory_id: e for members in buffer.groups.values() for e, tr in members}
        for (entry_id, traj), is_dup in zip(entries, seen, strict=True):
            if held.get(traj.trajectory_id) == entry_id:
                continue  # the same entry again (a re-read after a lost read): keep it held
            if is_dup or traj.trajectory_id in held:
                # re-delivered after a crash, or a zombie instance's copy
                await self._store.consume(job_id, [entry_id], [])
                continue
            held[traj.trajectory_id] = entry_id
            reason = self._drop_reason(spec, traj)
            if reason is None:
                dropped = buffer.add(entry_id, traj)
            else:
                await self._drop_group(job_id, buffer, traj.group_id, reason, batch)
                dropped = [(entry_id, traj, reason)]
            await self._drop(job_id, dropped, batch)

    async def _drop_group(self, job_id: str, buffer: GroupBuffer, group_id: str, reason: str,
                          batch: _Batch) -> None:
        """Break a group (counted once) and drop the members held so far."""
        if group_id not in buffer.broken:
            batch.dropped_groups += 1
            await self._store.consume(job_id, [], [], dropped_groups=1)
        await self._drop(job_id, buffer.break_group(group_id, reason), batch)

    async def _drop(self, job_id: str, dropped: list[tuple[str, t.Trajectory, str]],
                    batch: _Batch) -> None:
        for d_entry, d_traj, d_reason in dropped:
            if d_reason == "dropped_stale":
                batch.dropped_stale += 1
            else:
                batch.dropped_failed += 1
            await self._store.consume(job_id, [d_entry], [d_traj.trajectory_id],
                                      **{d_reason: 1})

    def _drop_reason(self, spec: JobSpec, traj: t.Trajectory) -> str | None:
        problem = traj.check_aligned()
        if problem is not None:
            logger.warning("[reject] trajectory_id=%s %s", traj.trajectory_id, problem)
            return "dropped_failed"
        if traj.status is not t.TrajectoryStatus.FINISHED:
            self._failures.observe(traj)  # raises when the failure ends the job
            return "dropped_failed"
        if staleness(self.policy_version, traj) > spec.algorithm.max_staleness:
            return "dropped_stale"
        return None

    async def _train_on(self, job_id: str, spec: JobSpec, backend: Backend,
                        batch: _Batch) -> dict[str, Any]:
        trajs = [tr for _, tr in batch.entries]
        samples = _to_samples(trajs)
        started = time.perf_counter()
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
        rewards = [tr.reward for tr in trajs]
        return {"reward_mean": sum(rewards) / len(rewards), "num_trajectories": len(trajs),
                "rollout_s": round(batch.wait_s, 4), "train_s": round(train_s, 4),
                "dropped_stale": batch.dropped_stale, "dropped_failed": batch.dropped_failed,
                "reward_components": component_means(trajs),
                "turns_mean": sum(tr.num_turns for tr in trajs) / len(trajs),
                "tokens_mean": sum(tr.num_generated_tokens for tr in trajs) / len(trajs),
                **hybrids,
                **{k: round(float(v), 6) for k, v in metrics.items()}}

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

    async def _publish(self, job_id: str, backend: Backend, run_dir: Path, model_dir: str,
                       version: int) -> float:
        """Write and announce a version; returns the seconds it took."""
        started = time.perf_counter()
        path = weights_file(run_dir, version)
        await asyncio.to_thread(backend.save_weights, str(path))
        # The pointer names the chunked manifest and carries the manifest's own sha256.
        manifest, digest = await asyncio.to_thread(write_manifest, path, version)
        await self._store.publish_policy(job_id, t.PolicyInfo(
            version, str(manifest), digest, model_dir, self._clock.now_ms()))
        self.policy_version = version
        return round(time.perf_counter() - started, 4)


def _to_samples(trajs: list[t.Trajectory]) -> list[TrainSample]:
    by_group: dict[str, list[t.Trajectory]] = {}
    for tr in trajs:
        by_group.setdefault(tr.group_id, []).append(tr)
    samples = []
    for group in by_group.values():
        for tr, adv in zip(group, group_advantages([tr.reward for tr in group]), strict=True):
            samples.append(TrainSample(token_ids=tr.token_ids, loss_mask=tr.loss_mask,
                                       rollout_logprobs=tr.logprobs, advantage=adv,
                                       group_id=tr.group_id, trajectory_id=tr.trajectory_id))
    return samples


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
