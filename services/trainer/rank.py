"""A data-parallel trainer rank on its own: ``python -m services.trainer.rank``.

Ranks 1..N-1 of the trainer's jobs when they run apart from the trainer service (other
hosts, the pods of a Kubernetes StatefulSet): given only the rendezvous address (rank 0's
``trainer.rendezvous.address``) and a rank, it joins the next job's group there, reads the
job from rank 0, trains it and joins again for the job after. Each job runs in a child
process (``spawn``) that leaves with ``os._exit`` once the job's group is done (see
``distributed.py``); this process only restarts it, so it never holds torch state.

Every option can also come from LIBRA_TRAINER_RANK_<OPTION>; torch's env:// variables
(MASTER_ADDR + MASTER_PORT, RANK, LOCAL_RANK) fill ``rendezvous``, ``rank`` and
``local_rank`` when those are not given, so a torchrun-style environment works unchanged.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch.multiprocessing as mp

from libra.config import env_flag, knob, load_config, redact
from libra.service_config import TelemetryConfig
from libra.telemetry import init_logging
from services.trainer.distributed import EXIT_NO_JOB, run_rank_process

logger = logging.getLogger("services.trainer.rank")

# After a failed or idle attempt (no store yet, a finished job's store), wait this long
# before the next: rank 0 opens a store only when a job starts.
RETRY_PAUSE_S = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class RankConfig:
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    rendezvous: str = knob("", "host:port of rank 0's rendezvous (the trainer service's "
                               "rendezvous.address); empty: MASTER_ADDR:MASTER_PORT")
    rank: int = knob(-1, "this process's rank before rank_offset, 1..N-1 in all; -1: RANK")
    rank_offset: int = knob(0, "added to rank: a StatefulSet numbers its pods from 0 and "
                               "rank 0 is the trainer service, so its pods set 1")
    local_rank: int = knob(-1, "GPU index on this host (cuda:<local_rank>); -1: LOCAL_RANK, "
                               "else 0")
    join_timeout_s: float = knob(300.0, "how long one attempt waits for rank 0's store and "
                                        "its job before trying again")
    max_jobs: int = knob(0, "leave after this many jobs (0: serve jobs until stopped)")

    @property
    def resolved_rank(self) -> int:
        return self.rank + self.rank_offset


def with_torch_env(cfg: RankConfig) -> RankConfig:
    """Fill what is unset from torch's env:// variables; ValueError naming what is missing."""
    if not cfg.rendezvous:
        host, port = env_flag("MASTER_ADDR"), env_flag("MASTER_PORT")
        if not (host and port):
            raise ValueError("config rendezvous: set it (host:port) or MASTER_ADDR and "
                             "MASTER_PORT")
        cfg = replace(cfg, rendezvous=f"{host}:{port}")
    if cfg.rank < 0:
        rank = env_flag("RANK")
        if not rank.isdigit():
            raise ValueError(f"config rank: set it (1..N-1) or RANK, got RANK={rank!r}")
        cfg = replace(cfg, rank=int(rank))
    if cfg.local_rank < 0:
        local = env_flag("LOCAL_RANK", "0")
        cfg = replace(cfg, local_rank=int(local) if local.isdigit() else 0)
    if cfg.resolved_rank < 1:
        raise ValueError(f"config rank: {cfg.resolved_rank} (rank + rank_offset) must be >= 1;"
                         " rank 0 is the trainer service")
    return cfg


def _run_one_job(cfg: RankConfig) -> None:
    """Child process: log like the parent, then join one job and leave (``os._exit``)."""
    init_logging(f"trainer-rank{cfg.resolved_rank}", cfg.telemetry)
    run_rank_process(cfg.resolved_rank, cfg.rendezvous, cfg.join_timeout_s, cfg.local_rank)


def serve(cfg: RankConfig) -> int:
    """Join job after job; returns the exit code once ``max_jobs`` jobs ran."""
    context = mp.get_context("spawn")
    rank, num_jobs = cfg.resolved_rank, 0
    while cfg.max_jobs == 0 or num_jobs < cfg.max_jobs:
        # Daemonic: on SIGTERM (SystemExit below) multiprocessing stops it before we exit.
        child = context.Process(target=_run_one_job, name=f"libra-trainer-rank{rank}",
                                args=(cfg,), daemon=True)
        child.start()
        child.join()
        if child.exitcode == 0:
            num_jobs += 1
            logger.info("[train] rank %d: job done (%d so far)", rank, num_jobs)
        elif child.exitcode == EXIT_NO_JOB:  # idle: rank 0 has no job; ask again at once
            logger.debug("[train] rank %d: no job at %s yet", rank, cfg.rendezvous)
        else:  # no store or no job yet, or a failed job: the child said why
            logger.info("[train] rank %d: attempt ended exit=%s; rejoining at %s", rank,
                        child.exitcode, cfg.rendezvous)
            time.sleep(RETRY_PAUSE_S)
    return 0


def _exit_on_sigterm(_signum: int, _frame: Any) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    config = with_torch_env(load_config(RankConfig, "trainer_rank", description=__doc__))
    init_logging(f"trainer-rank{config.resolved_rank}", config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    raise SystemExit(serve(config))
