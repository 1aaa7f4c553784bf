"""Data-parallel trainer: one job's policy trained by a torch.distributed group of N ranks.

Rank 0 is the trainer service's own process (the :class:`DistributedJobBackend` the core
calls); ranks 1..N-1 are daemonic processes spawned (``spawn`` start method) when the
backend is created and stopped by :meth:`DistributedJobBackend.close`. The group is formed
over a ``TCPStore`` (see ``rendezvous.py``): by default rank 0 opens it on a free port and
spawns ranks 1..N-1 on this machine; with ``trainer.rendezvous.address`` set, rank 0 opens it
on that port and ranks 1..N-1 are separate processes on any host (``python -m
services.trainer.rank``, e.g. the pods of a StatefulSet) that join with only that address,
read the job from the store, train it and rejoin for the next one.
Every rank builds the same :class:`JobBackend` from the job spec (same seed, same
initial weights); rank 0's parameters are broadcast anyway (by DDP, or before sharding
under FSDP2), and a checksum round checks that all ranks agree before the first step.

Parallelism (``trainer.parallelism``; ``auto`` picks by device):

- ``ddp`` (auto on CPU): every rank holds the whole model; ``DistributedDataParallel``
  all-reduces the gradients.
- ``fsdp2`` (auto on CUDA): ``fully_shard`` on each decoder layer, then the root; each rank
  holds 1/N of every parameter and of the optimizer state; gradients are reduce-scattered.
  Also runs on CPU over gloo (tested with 2 ranks).

Device (``auto``): CUDA when available, else CPU. On CPU the group is gloo; on CUDA it is
``cpu:gloo,cuda:nccl`` (NCCL for the model's tensors, gloo for the command objects and the
small CPU metric reductions), one rank per GPU on ``cuda:<rank>`` (one machine, so the
local rank is the rank; a rank started on its own uses its ``--local-rank``). The GPU
path is wired but is only run where CUDA is present.

Rank 0 drives the workers: each command (name + arguments) goes out with
``broadcast_object_list``; every rank runs it on its own backend, which splits the batch by
stride across ranks and reduces gradients (see ``torch_backend.py``); then every rank's
outcome is gathered on rank 0 (``gather_object``), so an error on a worker is raised on
rank 0 naming the rank. Metrics come back from rank 0 (already reduced over the group).
Saving is a command too: every rank takes part in gathering the full state dict (a
collective under FSDP2) and only rank 0 writes. Every rank loads a checkpoint from the
same folder (one machine, or a volume every rank mounts) and, under FSDP2, keeps its shard.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from libra.jobspec import JobSpec, job_spec_from_json
from libra.training.samples import TrainSample
from libra.training.tensors import state_checksum
from services.trainer import rendezvous as meeting
from services.trainer.backend_protocol import BackendFactory
from services.trainer.rendezvous import GroupSettings

if TYPE_CHECKING:
    # transformers (seconds of CPU) loads with the first model built, not at import: a
    # rank process re-imports this module for every attempt to join, and most attempts
    # of a rank waiting between jobs find none.
    from libra.training.backend import JobBackend

logger = logging.getLogger(__name__)

_LOCAL_HOST = "127.0.0.1"
EXIT_NO_JOB = 3
_STOP = "stop"


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when CUDA is available, else ``cpu``; others pass through."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    return device


def resolve_parallelism(parallelism: str, device: str) -> str:
    """``auto`` -> ``fsdp2`` on CUDA, ``ddp`` on CPU; ``ddp``/``fsdp2`` pass through."""
    from libra.training.parallel import PARALLELISMS

    if parallelism == "auto":
        return "fsdp2" if device == "cuda" else "ddp"
    if parallelism not in PARALLELISMS:
        raise ValueError(f"parallelism must be auto, ddp or fsdp2, got {parallelism!r}")
    return parallelism


def process_group_backend(device: str) -> str:
    """gloo on CPU; on CUDA, NCCL for CUDA tensors and gloo for CPU ones."""
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


def rank_device(device: str, rank: int) -> str:
    """This rank's torch device: ``cpu`` or ``cuda:<rank>`` (GPU path: also selects it)."""
    if device != "cuda":
        return "cpu"
    torch.cuda.set_device(rank)
    return f"cuda:{rank}"


def _run(backend: JobBackend, rank: int, name: str, args: tuple) -> Any:
    """Execute one command on this rank's backend."""
    if name == "warm_start":
        return backend.warm_start()
    if name == "train_step":
        return backend.train_step(*args)
    if name == "load_checkpoint":
        return backend.load_checkpoint(*args)
    if name == "load_model_weights":
        return backend.load_model_weights(*args)
    if name == "save_weights":
        return backend.save_weights(*args)
    if name == "save_checkpoint":
        return backend.save_checkpoint(*args)
    if name == "checksum":
        return state_checksum(backend.model)
    if name == _STOP:
        return None
    raise ValueError(f"unknown command {name!r}")


def run_rank_process(*args: Any) -> None:
    """Process target: serve, then leave with ``os._exit``.

    The interpreter's own teardown after a gloo group (its threads, atexit hooks) was seen
    to hang now and then; nothing is left to flush, so skip it. Exit codes: 0 the job ran,
    ``EXIT_NO_JOB`` no job opened at the rendezvous in time (a rank waiting between jobs),
    1 anything else (traceback on stderr).
    """
    code = 0
    try:
        _worker_main(*args)
    except meeting.NoJobYet:
        code = EXIT_NO_JOB
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


def _worker_main(rank: int, address: str, join_timeout_s: float, local_rank: int) -> None:
    """Rank ``rank`` (>= 1): join at ``address``, build the job's backend from the settings
    rank 0 published, serve commands until stop."""
    logger.info("[train] rank %d: connecting to the rendezvous at %s", rank, address)
    store, job = meeting.join(address, rank, join_timeout_s)
    placement = rank_device(job.device, local_rank)
    dist.init_process_group(process_group_backend(job.device), store=store, rank=rank,
                            world_size=job.world_size,
                            timeout=datetime.timedelta(seconds=job.timeout_s))
    logger.info("[train] rank %d of %d joined at %s", rank, job.world_size, address)
    # No destroy_process_group here: in gloo it can wait for rank 0, which is itself
    # waiting for this process to exit; the process leaves with os._exit instead.
    from libra.training.backend import JobBackend

    backend = JobBackend(job_spec_from_json(job.spec_json), job.model_dir, job.num_threads,
                         write_model_dir=False)
    backend.enable_data_parallel(job.parallelism, placement)
    while True:
        message: list[Any] = [None]
        dist.broadcast_object_list(message, src=0)
        name, args = message[0]
        try:
            outcome: tuple[bool, Any] = (True, _run(backend, rank, name, args))
        except Exception as exc:  # reported to rank 0, which raises it
            outcome = (False, f"{type(exc).__name__}: {exc}")
        dist.gather_object(outcome, None, dst=0)
        if name == _STOP:
            break


class DistributedJobBackend:
    """A job's policy trained by ``num_ranks`` data-parallel ranks (this process is rank 0).

    Same methods as :class:`JobBackend`, plus :meth:`checksums` and :meth:`close`.

    Args:
        spec: The job.
        model_dir: Where rank 0 writes the model config and tokenizer.
        num_threads: torch intra-op threads per rank.
        num_ranks: Group size (>= 2).
        timeout_s: Collective timeout; a dead or stuck rank fails the call after this, and
            a rank that has not joined by then fails the start naming it.
        parallelism: ``auto``, ``ddp`` or ``fsdp2`` (:func:`resolve_parallelism`).
        device: ``auto``, ``cpu`` or ``cuda`` (:func:`resolve_device`).
        rendezvous: ``(address, store)``: the ``host:port`` the other ranks join at and
            rank 0's store listening on that port (kept across jobs, see
            :class:`DistributedBackendFactory`); None: a store of this job's own on a free
            port, ranks 1..N-1 spawned here.
    """

    def __init__(self, spec: JobSpec, model_dir: str, num_threads: int, num_ranks: int,
                 timeout_s: float = 300.0, parallelism: str = "auto",
                 device: str = "auto",
                 rendezvous: tuple[str, dist.TCPStore] | None = None) -> None:
        if num_ranks < 2:
            raise ValueError("DistributedJobBackend needs num_ranks >= 2 (use JobBackend)")
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed group is already active in this process")
        self.device = resolve_device(device)
        self.parallelism = resolve_parallelism(parallelism, self.device)
        spawn_here = rendezvous is None
        if spawn_here and self.device == "cuda" and num_ranks > torch.cuda.device_count():
            raise ValueError(f"{num_ranks} ranks need {num_ranks} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        self._num_ranks = num_ranks
        self._lock = threading.Lock()
        self._closed = False
        timeout = datetime.timedelta(seconds=timeout_s)
        if rendezvous is None:
            store = meeting.open_store(0, timeout_s)
            rendezvous = (f"{_LOCAL_HOST}:{store.port}", store)
        self.address, self._store = rendezvous
        self._generation = meeting.begin(self._store, GroupSettings(
            world_size=num_ranks, spec_json=spec.to_json(), model_dir=model_dir,
            num_threads=num_threads, parallelism=self.parallelism, device=self.device,
            timeout_s=timeout_s))
        self._workers = self._spawn_workers(timeout_s) if spawn_here else []
        try:
            meeting.wait_for_ranks(self._store, self._generation, self.address, num_ranks,
                                   timeout_s, check_alive=self._check_workers)
            placement = rank_device(self.device, 0)
            dist.init_process_group(process_group_backend(self.device),
                                    store=meeting.group_store(self._store, self._generation),
                                    rank=0, world_size=num_ranks, timeout=timeout)
            from libra.training.backend import JobBackend

            self._local = JobBackend(spec, model_dir, num_threads)
            self._local.enable_data_parallel(self.parallelism, placement)
            sums = self.checksums()
        except BaseException:
            self._kill_workers()
            if dist.is_initialized():
                dist.destroy_process_group()
            meeting.end(self._store, self._generation)
            raise
        if len(set(sums)) != 1:
            self.close()
            raise RuntimeError(f"ranks disagree on the initial weights: {sums}")
        logger.info("[train] data-parallel group up ranks=%d parallelism=%s device=%s "
                    "rendezvous=%s", num_ranks, self.parallelism, self.device, self.address)

    def _spawn_workers(self, timeout_s: float) -> list[Any]:
        """Start ranks 1..N-1 here; they join at this backend's address."""
        context = mp.get_context("spawn")
        workers = [
            context.Process(target=run_rank_process, name=f"libra-trainer-rank{rank}", daemon=True,
                            args=(rank, self.address, timeout_s, rank))
            for rank in range(1, self._num_ranks)
        ]
        for worker in workers:
            worker.start()
        return workers

    def _check_workers(self) -> None:
        """Raise when a rank spawned here died (while the others wait to join)."""
        dead = [worker.name for worker in self._workers if not worker.is_alive()]
        if dead:
            raise RuntimeError(f"data-parallel ranks died: {dead}")

    def warm_start(self, should_stop: Callable[[], bool] = lambda: False) -> dict[str, float]:
        # The ranks step together (collectives): one that stopped alone would hang the
        # others, so a cancel waits for the whole warm start here.
        del should_stop
        return self._call("warm_start")[0]

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        return self._call("train_step", list(samples))[0]

    def save_weights(self, path: str) -> str:
        return self._call("save_weights", path)[0]

    def save_checkpoint(self, directory: str) -> list[str]:
        return self._call("save_checkpoint", directory)[0]

    def load_checkpoint(self, directory: str) -> None:
        self._call("load_checkpoint", directory)

    def load_model_weights(self, checkpoint_dir: str) -> None:
        self._call("load_model_weights", checkpoint_dir)

    def checksums(self) -> list[str]:
        """Every rank's state-dict sha256, by rank."""
        return self._call("checksum")

    def close(self) -> None:
        """Stop the workers and leave the group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if all(worker.is_alive() for worker in self._workers):
                self._call(_STOP, closing=True)
        except Exception:
            logger.exception("[train] stopping the data-parallel workers failed")
        finally:
            for worker in self._workers:
                worker.join(timeout=10.0)
            self._kill_workers()
            if dist.is_initialized():
                dist.destroy_process_group()
            meeting.end(self._store, self._generation)

    def _call(self, name: str, *args: Any, closing: bool = False) -> list[Any]:
        """Run a command on every rank; returns the per-rank results (rank 0 first)."""
        with self._lock:
            if self._closed and not closing:
                raise RuntimeError("the data-parallel backend is closed")
            self._check_workers()
            dist.broadcast_object_list([(name, args)], src=0)
            error: BaseException | None = None
            try:
                mine: Any = _run(self._local, 0, name, args)
            except Exception as exc:
                error, mine = exc, None
            outcomes: list[Any] = [None] * self._num_ranks
            dist.gather_object((True, mine), outcomes, dst=0)
            if error is not None:
                raise error
            failed = [f"rank {rank}: {payload}"
                      for rank, (ok, payload) in enumerate(outcomes) if not ok]
            if failed:
                raise RuntimeError(f"{name} failed on " + "; ".join(failed))
            return [payload for _, payload in outcomes]

    def _kill_workers(self) -> None:
        for worker in self._workers:
            if worker.is_alive():
                worker.terminate()
                worker.join(timeout=5.0)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=5.0)


class DistributedBackendFactory:
    """Creates a :class:`DistributedJobBackend` of ``num_ranks`` ranks per job.

    With a rendezvous address, the store listening on its port is opened on the first
    job and kept for the life of the process: every job is a generation of it (see
    ``rendezvous.py`` for why a store per job cannot reuse the port)."""

    def __init__(self, num_threads: int = 1, num_ranks: int = 2,
                 parallelism: str = "auto", rendezvous_address: str = "",
                 timeout_s: float = 300.0) -> None:
        self._num_threads = num_threads
        self._num_ranks = num_ranks
        self._parallelism = parallelism
        self._rendezvous_address = rendezvous_address
        self._timeout_s = timeout_s
        self._store: dist.TCPStore | None = None

    def create(self, spec: JobSpec, model_dir: str) -> DistributedJobBackend:
        rendezvous = None
        if self._rendezvous_address:
            if self._store is None:
                port = meeting.split_address(self._rendezvous_address)[1]
                self._store = meeting.open_store(port, self._timeout_s)
            rendezvous = (self._rendezvous_address, self._store)
        return DistributedJobBackend(spec, model_dir, self._num_threads, self._num_ranks,
                                     timeout_s=self._timeout_s, parallelism=self._parallelism,
                                     rendezvous=rendezvous)


def make_backend_factory(num_threads: int, num_ranks: int, parallelism: str = "auto",
                         rendezvous_address: str = "",
                         timeout_s: float = 300.0) -> BackendFactory:
    """The trainer's backend factory: in-process for 1 rank, a process group for more
    (ranks spawned here, or joining at ``rendezvous_address``)."""
    if num_ranks == 1:
        from libra.training.backend import TorchBackendFactory

        return TorchBackendFactory(num_threads)
    return DistributedBackendFactory(num_threads, num_ranks, parallelism, rendezvous_address,
                                     timeout_s)
