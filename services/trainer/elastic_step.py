"""Training steps with hybrids: slices out, payloads in, one merged update (pure).

:class:`ElasticTrainer` is what the trainer core delegates to while a job with
``elastic.enabled`` runs. At each step boundary it refreshes membership against the
worker leases (an expired lease or a moved-on epoch detaches the hybrid: fencing) and
advances join states (:class:`GradientDomain`). A step then

1. splits the batch into whole-group slices, one for the core and one per active hybrid,
   each scaled by its share of the batch's trainable tokens;
2. sends the hybrids their slices, computes the core's own, and waits for the hybrids'
   payloads at most ``gradient_deadline_s``;
3. computes any slice whose payload is missing or refused on the core (re-assigned,
   never dropped) and detaches that hybrid;
4. sums the gradients in slice order, clips and steps, and streams the sum to every
   hybrid that is joining or active, which applies the same update (lockstep).

With no hybrid connected the plain ``train_step`` runs: nothing changes for a job that
never lends a worker.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from libra import types as t
from libra.training import channel as ch
from libra.training.samples import TrainSample
from services.trainer.elastic import EventSink, GradientDomain, HybridSession, split_slices

if TYPE_CHECKING:
    from libra.jobspec import JobSpec

logger = logging.getLogger(__name__)

_SNAPSHOTS_KEPT = 2


class SliceBackend(Protocol):
    def train_step(self, samples: list[TrainSample]) -> dict[str, float]: ...

    def slice_gradient(self, samples: list[TrainSample], scale: float
                       ) -> tuple[bytes, dict[str, float], bool]: ...

    def apply_slices(self, payloads: list[bytes]) -> tuple[float, bytes]: ...

    def checksum(self) -> str: ...

    def save_checkpoint(self, directory: str) -> list[str]: ...


class LeaseReader(Protocol):
    async def list_workers(self) -> list[t.Lease]: ...


class ElasticTrainer:
    """The core side of one elastic job."""

    def __init__(self, spec: JobSpec, spec_json: str, backend: SliceBackend, run_dir: Path,
                 domain: GradientDomain, leases: LeaseReader, record_event: EventSink) -> None:
        self._spec = spec
        self._spec_json = spec_json
        self._backend = backend
        self._dir = run_dir / "elastic"
        self.domain = domain
        self._leases = leases
        self._record_event = record_event
        self._snapshots: dict[int, ch.Snapshot] = {}
        self.policy_version = -1

    # -- the gradient channel's view (the servicer calls these through the trainer core) --

    def connect_hybrid(self, hello: ch.Hello) -> HybridSession:
        return self.domain.connect(hello)

    def elastic_message(self, session: HybridSession, msg: ch.HybridMessage) -> None:
        self.domain.on_message(session, msg)

    def disconnect_hybrid(self, session: HybridSession, reason: str) -> None:
        self.domain.disconnect(session, reason)

    # -- boundaries -----------------------------------------------------------------------

    async def boundary(self, step: int, policy_version: int) -> None:
        """Between steps: fence against leases, then advance the join states."""
        self.policy_version = policy_version
        if not self.domain.sessions:
            return
        await self._fence()
        await self.domain.at_boundary(step, self._snapshot)

    async def _fence(self) -> None:
        live = [s for s in self.domain.sessions.values() if not s.detached]
        if not live:
            return
        try:
            leases = {lease.worker_id: lease for lease in await self._leases.list_workers()}
        except Exception as exc:  # noqa: BLE001 - the coordinator may be briefly away
            logger.warning("[elastic] lease check skipped error=%s", exc)
            return
        for session in live:
            reason = _fence_reason(session, leases.get(session.worker_id))
            if reason is not None:
                self.domain.disconnect(session, reason)
        await self.domain.flush_events()

    async def _snapshot(self, step: int) -> ch.Snapshot:
        """The core's state after ``step``, written once however many hybrids join."""
        if step not in self._snapshots:
            directory = self._dir / f"step-{step:06d}"
            started = time.perf_counter()
            await asyncio.to_thread(_write_snapshot, self._backend, directory)
            self._snapshots[step] = ch.Snapshot(str(directory), step, self.policy_version,
                                                self._spec_json)
            for old in sorted(self._snapshots)[:-_SNAPSHOTS_KEPT]:
                shutil.rmtree(self._snapshots.pop(old).directory, ignore_errors=True)
            await self._record_event("hybrid_snapshot_written", step=str(step),
                                     write_s=f"{time.perf_counter() - started:.4f}")
        return self._snapshots[step]

    # -- steps ----------------------------------------------------------------------------

    @property
    def engaged(self) -> bool:
        """Some hybrid needs this step's update (joining after its snapshot, or active)."""
        return any(s.base_step is not None and not s.detached
                   for s in self.domain.sessions.values())

    async def train(self, samples: list[TrainSample], step: int) -> dict[str, Any]:
        """Train ``step`` (1-based); returns the step's metrics."""
        if not self.engaged:
            return await asyncio.to_thread(self._backend.train_step, samples)
        slices = split_slices(samples, 1 + len(self.domain.active()))
        total = max(sum(sum(s.loss_mask) for s in samples), 1)
        scales = [sum(sum(s.loss_mask) for s in sl) / total for sl in slices]
        assigned = self._assign(slices, scales, step)
        own = await asyncio.to_thread(self._backend.slice_gradient, slices[0], scales[0])
        accepted, missing = await self.domain.gather(
            assigned, step, self.policy_version, self._spec.elastic.gradient_deadline_s)
        results: dict[int, tuple[bytes, dict[str, float], bool]] = {0: own}
        for slice_id, payload in accepted.items():
            results[slice_id] = (payload.data, payload.metrics, not payload.non_finite)
        for slice_id, reason in missing.items():
            await self._record_event("slice_reassigned", step=str(step),
                                     worker_id=assigned[slice_id].worker_id, reason=reason)
            results[slice_id] = await asyncio.to_thread(
                self._backend.slice_gradient, slices[slice_id], scales[slice_id])
        ordered = [results[i] for i in range(len(slices))]
        metrics = await self._apply(ordered, step)
        metrics.update(hybrid_slices=float(len(accepted)), reassigned_slices=float(len(missing)),
                       lockstep_verified=float(self.domain.lockstep_verified),
                       rejected_payloads=float(self.domain.rejected_payloads))
        return metrics

    def _assign(self, slices: list[list[TrainSample]], scales: list[float], step: int
                ) -> dict[int, HybridSession]:
        assigned: dict[int, HybridSession] = {}
        for slice_id, session in enumerate(self.domain.active(), start=1):
            if slice_id >= len(slices):
                break  # fewer groups than workers: this hybrid sits the step out
            assert session.active_epoch is not None
            session.send(ch.SliceTask(step, self.policy_version, session.active_epoch,
                                      slice_id, scales[slice_id], slices[slice_id]))
            assigned[slice_id] = session
        return assigned

    async def _apply(self, ordered: list[tuple[bytes, dict[str, float], bool]], step: int
                     ) -> dict[str, Any]:
        lr = self._spec.algorithm.learning_rate
        finite = all(ok for _, _, ok in ordered)
        grad_norm, merged = math.nan, b""
        if finite:
            grad_norm, merged = await asyncio.to_thread(
                self._backend.apply_slices, [data for data, _, _ in ordered])
        skipped = not math.isfinite(grad_norm)
        self.domain.broadcast(ch.Update(step, b"" if skipped else merged, skipped, lr))
        interval = self._spec.elastic.lockstep_check_interval
        if not skipped and interval and step % interval == 0:
            self.domain.remember_checksum(step, await asyncio.to_thread(self._backend.checksum))
        metrics = _merge_metrics([m for _, m, _ in ordered])
        metrics.update(grad_norm=grad_norm, is_skipped=float(skipped))
        return metrics

    def close(self, reason: str) -> None:
        for session in list(self.domain.sessions.values()):
            self.domain.disconnect(session, reason)


def _fence_reason(session: HybridSession, lease: t.Lease | None) -> str | None:
    """Why a session no longer matches its worker's lease (None: it still does).

    A joining hybrid may already hold its training epoch before its Activated message
    arrives, so it only has to keep a hybrid training role at an epoch not older than
    its hello; an active one must hold exactly the epoch it activated with.
    """
    if lease is None:
        return "lease expired"
    if session.state == "active":
        if lease.role is not t.WorkerRole.HYBRID_TRAINING or lease.epoch != session.active_epoch:
            return f"lease is {lease.role.value}@{lease.epoch}, not hybrid-training@" \
                   f"{session.active_epoch}"
        return None
    if lease.role not in (t.WorkerRole.HYBRID_JOINING, t.WorkerRole.HYBRID_TRAINING) \
            or lease.epoch < session.hello.epoch:
        return f"lease is {lease.role.value}@{lease.epoch}, join was at {session.hello.epoch}"
    return None


def _write_snapshot(backend: SliceBackend, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    backend.save_checkpoint(str(directory))


def _merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Token-weighted means of the slices' metrics; tokens summed, times maxed."""
    total = sum(p.get("num_tokens", 0.0) for p in parts) or 1.0
    merged: dict[str, float] = {}
    for name in sorted({k for p in parts for k in p}):
        values = [(p.get(name, 0.0), p.get("num_tokens", 0.0)) for p in parts]
        if name == "num_tokens":
            merged[name] = sum(v for v, _ in values)
        elif name.endswith("_s"):
            merged[name] = max(v for v, _ in values)
        else:
            merged[name] = sum(v * n for v, n in values) / total
    return merged
