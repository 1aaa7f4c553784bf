"""Data-parallel trainer: one job's policy trained by a torch.distributed group of N ranks.

Rank 0 is the trainer service's own process (the :class:`DistributedJobBackend` the core
calls); ranks 1..N-1 are daemonic processes spawned (``spawn`` start method) when the
backend is created and stopped by :meth:`DistributedJobBackend.close`. The group is formed
over a ``TCPStore`` that rank 0 opens on ``127.0.0.1`` on a free port (port 0, the kernel
picks). Every rank builds the same :class:`JobBackend` from the job spec (same seed, same
initial weights); wrapping the model in ``DistributedDataParallel`` broadcasts rank 0's
parameters anyway, and a checksum round checks that all ranks agree before the first step.

Rank 0 drives the workers: each command (name + arguments) goes out with
``broadcast_object_list``; every rank runs it on its own backend, which splits the batch by
stride across ranks, all-reduces gradients through DDP and steps its own optimizer (see
``torch_backend.py``); then every rank's outcome is gathered on rank 0 (``gather_object``),
so an error on a worker is raised on rank 0 naming the rank. Metrics come back from rank 0
(already reduced over the group). Only rank 0 writes weights and checkpoints (the ranks'
states are identical); every rank loads a checkpoint (from the same folder: one machine).

CPU: gloo + DDP (built and tested, 2 ranks). GPU mapping (not built): the same command
protocol over an NCCL group, one rank per GPU (``torch.cuda.set_device(rank)``), the model
sharded with FSDP2 (``torch.distributed.fsdp.fully_shard`` on each decoder layer, then the
root) instead of DDP; gradients are then reduce-scattered rather than all-reduced, and
``save_weights``/``save_checkpoint`` must first gather the full state dict
(``torch.distributed.checkpoint.state_dict.get_model_state_dict`` with
``full_state_dict=True, cpu_offload=True``) on rank 0.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import sys
import threading
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from libra.jobspec import JobSpec
from services.trainer.backend import JobBackend
from services.trainer.train_types import TrainSample

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_STOP = "stop"


def state_checksum(model: torch.nn.Module) -> str:
    """sha256 over the state dict (names and raw bytes, in name order)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _run(backend: JobBackend, rank: int, name: str, args: tuple) -> Any:
    """Execute one command on this rank's backend."""
    if name == "warm_start":
        return backend.warm_start()
    if name == "train_step":
        return backend.train_step(*args)
    if name == "load_checkpoint":
        return backend.load_checkpoint(*args)
    if name == "checksum":
        return state_checksum(backend.model)
    if name == _STOP:
        return None
    raise ValueError(f"unknown command {name!r}")


def _worker_entry(*args: Any) -> None:
    """Process target: serve, then leave with ``os._exit``.

    The interpreter's own teardown after a gloo group (its threads, atexit hooks) was seen
    to hang now and then; nothing is left to flush, so skip it.
    """
    code = 0
    try:
        _worker_main(*args)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


def _worker_main(rank: int, world: int, port: int, spec: JobSpec, model_dir: str,
                 num_threads: int, timeout_s: float) -> None:
    """Rank ``rank`` (>= 1): join the group, build the backend, serve commands until stop."""
    store = dist.TCPStore(_HOST, port, world, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    # No destroy_process_group here: in gloo it can wait for rank 0, which is itself
    # waiting for this process to exit; the process leaves with os._exit instead.
    backend = JobBackend(spec, model_dir, num_threads, write_model_dir=False)
    backend.enable_data_parallel()
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
        timeout_s: Collective timeout; a dead or stuck rank fails the call after this.
    """

    def __init__(self, spec: JobSpec, model_dir: str, num_threads: int, num_ranks: int,
                 timeout_s: float = 300.0) -> None:
        if num_ranks < 2:
            raise ValueError("DistributedJobBackend needs num_ranks >= 2 (use JobBackend)")
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed group is already active in this process")
        self._num_ranks = num_ranks
        self._lock = threading.Lock()
        self._closed = False
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(_HOST, 0, num_ranks, is_master=True, timeout=timeout,
                              wait_for_workers=False)
        context = mp.get_context("spawn")
        self._workers = [
            context.Process(target=_worker_entry, name=f"libra-trainer-rank{rank}", daemon=True,
                            args=(rank, num_ranks, store.port, spec, model_dir, num_threads,
                                  timeout_s))
            for rank in range(1, num_ranks)
        ]
        for worker in self._workers:
            worker.start()
        try:
            dist.init_process_group("gloo", store=store, rank=0, world_size=num_ranks,
                                    timeout=timeout)
            self._local = JobBackend(spec, model_dir, num_threads)
            self._local.enable_data_parallel()
            sums = self.checksums()
        except BaseException:
            self._kill_workers()
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        if len(set(sums)) != 1:
            self.close()
            raise RuntimeError(f"ranks disagree on the initial weights: {sums}")
        logger.info("[train] data-parallel group up ranks=%d port=%d", num_ranks, store.port)

    def warm_start(self) -> dict[str, float]:
        return self._call("warm_start")[0]

    def train_step(self, samples: list[TrainSample]) -> dict[str, float]:
        return self._call("train_step", list(samples))[0]

    def save_weights(self, path: str) -> str:
        with self._lock:
            return self._local.save_weights(path)

    def save_checkpoint(self, directory: str) -> list[str]:
        with self._lock:
            return self._local.save_checkpoint(directory)

    def load_checkpoint(self, directory: str) -> None:
        self._call("load_checkpoint", directory)

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

    def _call(self, name: str, *args: Any, closing: bool = False) -> list[Any]:
        """Run a command on every rank; returns the per-rank results (rank 0 first)."""
        with self._lock:
            if self._closed and not closing:
                raise RuntimeError("the data-parallel backend is closed")
            dead = [worker.name for worker in self._workers if not worker.is_alive()]
            if dead:
                raise RuntimeError(f"data-parallel ranks died: {dead}")
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
    """Creates a :class:`DistributedJobBackend` of ``num_ranks`` ranks per job."""

    def __init__(self, num_threads: int = 1, num_ranks: int = 2) -> None:
        self._num_threads = num_threads
        self._num_ranks = num_ranks

    def create(self, spec: JobSpec, model_dir: str) -> DistributedJobBackend:
        return DistributedJobBackend(spec, model_dir, self._num_threads, self._num_ranks)
