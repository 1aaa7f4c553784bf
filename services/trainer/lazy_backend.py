"""The trainer service's backend factory, its torch code imported at the first job.

Importing torch and transformers costs seconds of CPU (6-7 s on a loaded machine); the
service answers health checks and serves weights without them, so a trainer that is
started and never given a job (a restarted stack's spare, a probe) never pays it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from libra.jobspec import JobSpec
    from services.trainer.backend_protocol import Backend, BackendFactory


class LazyBackendFactory:
    """``make_backend_factory``'s factory (services/trainer/distributed.py), built on the
    first :meth:`create` with the arguments given here."""

    def __init__(self, num_threads: int, num_ranks: int, parallelism: str = "auto",
                 rendezvous_address: str = "", timeout_s: float = 300.0) -> None:
        self._args = (num_threads, num_ranks, parallelism, rendezvous_address, timeout_s)
        self._factory: BackendFactory | None = None

    def create(self, spec: JobSpec, model_dir: str) -> Backend:
        if self._factory is None:
            from services.trainer.distributed import make_backend_factory

            self._factory = make_backend_factory(*self._args)
        return self._factory.create(spec, model_dir)
