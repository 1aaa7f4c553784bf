"""Trainer ranks that meet at a configured address (multi-node training).

Rank 0 is a :class:`DistributedJobBackend` given ``rendezvous_address``; the other ranks
are separate ``python -m services.trainer.rank`` processes given nothing but that address
and their rank (no spec, no port of their own, nothing shared in memory). The address is
this host's non-loopback one where it has one, so nothing relies on 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from libra.jobspec import AlgorithmSpec, JobSpec, ModelSpec, TaskSpec
from libra_cli.redis_server import free_port
from services.trainer.distributed import DistributedBackendFactory
from services.trainer.rank import RankConfig, with_torch_env
from services.trainer.rendezvous import RendezvousTimeout
from tests.unit.trainer.test_distributed_backend import _samples

ROOT = Path(__file__).resolve().parents[3]
SPEC = JobSpec(
    model=ModelSpec(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64),
    task=TaskSpec(num_prompts=16),
    algorithm=AlgorithmSpec(sft_steps=2, sft_batch_size=4, learning_rate=1e-2),
)


def _host() -> str:
    """An address of this host other than loopback, when it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))  # no packet is sent: picks the outgoing address
            address = sock.getsockname()[0]
        except OSError:
            return "127.0.0.1"
    return address if not address.startswith("127.") else "127.0.0.1"


def _start_rank(address: str, rank: int, log: Path, *extra: str,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """A rank in its own process, told only where to meet and who it is."""
    argv = [sys.executable, "-m", "services.trainer.rank", "--join-timeout-s", "60", *extra]
    if address:
        argv += ["--rendezvous", address]
    if rank >= 0:
        argv += ["--rank", str(rank)]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LIBRA_")}
    return subprocess.Popen(argv, cwd=ROOT, env={**environ, **(env or {})},
                            stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_for_line(log: Path, text: str, proc: subprocess.Popen,
                   timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_ranks_in_separate_processes_train_together_job_after_job(tmp_path: Path) -> None:
    address = f"{_host()}:{free_port()}"
    # One rank from the CLI, one from torch's env:// variables (torchrun-style); each
    # serves two jobs in a row, so rejoining for the next job is exercised too.
    host, port = address.rsplit(":", 1)
    ranks = [_start_rank(address, 1, tmp_path / "rank1.log", "--max-jobs", "2"),
             _start_rank("", -1, tmp_path / "rank2.log", "--max-jobs", "2",
                         env={"MASTER_ADDR": host, "MASTER_PORT": port, "RANK": "2"})]
    factory = DistributedBackendFactory(num_threads=1, num_ranks=3, parallelism="ddp",
                                        rendezvous_address=address, timeout_s=120)
    try:
        for job in range(2):
            backend = factory.create(SPEC, str(tmp_path / f"model{job}"))
            try:
                assert backend.address == address and backend._workers == []
                assert backend._generation == job + 1
                before = backend.checksums()
                assert len(set(before)) == 1 and len(before) == 3
                step = backend.train_step(_samples(6))
                assert step["is_skipped"] == 0.0
                after = backend.checksums()
                assert len(set(after)) == 1 and after != before
            finally:
                backend.close()
        for proc in ranks:
            assert proc.wait(timeout=60) == 0
    finally:
        for proc in ranks:
            _stop(proc)
    log = (tmp_path / "rank1.log").read_text()
    assert log.count("job done") == 2, log[-3000:]


def test_a_rank_that_never_joins_fails_the_start_naming_address_and_rank(
        tmp_path: Path) -> None:
    from services.trainer import rendezvous

    address = f"{_host()}:{free_port()}"
    # Rank 1 checks in from a thread of this process (a rank process, as in the test
    # above, spends seconds importing torch before it dials: on a loaded machine that
    # outlasted rank 0's clock and rank 1 was named missing too). Only rank 2 is missing.
    joined: list[int] = []
    rank1 = threading.Thread(
        target=lambda: joined.append(rendezvous.join(address, 1, timeout_s=60)[1].world_size),
        daemon=True)
    rank1.start()
    started = time.monotonic()
    with pytest.raises(RendezvousTimeout) as err:
        DistributedBackendFactory(num_threads=1, num_ranks=3, rendezvous_address=address,
                                  timeout_s=8).create(SPEC, str(tmp_path / "model"))
    assert time.monotonic() - started < 60
    rank1.join(timeout=60)
    assert joined == [3]
    message = str(err.value)
    assert address in message and "rank(s) [2] of 3" in message, message
    assert "joined: [0, 1]" in message, message


def test_a_rank_outside_the_group_is_refused(tmp_path: Path) -> None:
    from services.trainer import rendezvous
    from services.trainer.rendezvous import GroupSettings

    store = rendezvous.open_store(0, 10)
    address = f"127.0.0.1:{store.port}"
    with pytest.raises(TimeoutError, match="no job within"):
        rendezvous.join(address, 1, 0.2)  # nothing published yet
    settings = GroupSettings(world_size=2, spec_json=SPEC.to_json(), model_dir="",
                             num_threads=1, parallelism="ddp", device="cpu", timeout_s=10)
    first = rendezvous.begin(store, settings)
    with pytest.raises(ValueError, match="rank 2 is outside the group"):
        rendezvous.join(address, 2, 10)
    rendezvous.join(address, 1, 10)
    with pytest.raises(ValueError, match="rank 1 joined twice"):
        rendezvous.join(address, 1, 10)
    rendezvous.end(store, first)
    with pytest.raises(TimeoutError):
        rendezvous.join(address, 1, 0.2)  # the finished job is not joined again
    second = rendezvous.begin(store, settings)
    assert second == first + 1
    rendezvous.join(address, 1, 10)  # the same rank joins the next job


def test_rank_config_takes_torch_env_names_and_refuses_rank_zero(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "trainer")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "3")
    cfg = with_torch_env(RankConfig())
    assert (cfg.rendezvous, cfg.resolved_rank, cfg.local_rank) == ("trainer:29500", 3, 0)
    # A StatefulSet pod index 0 with offset 1 is rank 1.
    assert with_torch_env(RankConfig(rank=0, rank_offset=1)).resolved_rank == 1
    with pytest.raises(ValueError, match="must be >= 1"):
        with_torch_env(RankConfig(rank=0))
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        with_torch_env(RankConfig(rank=1))


def test_a_rank_waiting_between_jobs_asks_again_quietly(tmp_path: Path) -> None:
    from services.trainer import rendezvous

    store = rendezvous.open_store(0, 30)  # rank 0 is up, with no job yet
    log = tmp_path / "rank1.log"
    rank1 = _start_rank(f"127.0.0.1:{store.port}", 1, log, "--join-timeout-s", "1")
    try:
        deadline = time.monotonic() + 120
        while log.read_text().count("connecting to the rendezvous") < 2:
            assert rank1.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        _stop(rank1)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
