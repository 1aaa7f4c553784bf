"""``libra status``: each service row carries its worker lease (role, epoch, bucket)."""

from __future__ import annotations

from libra import types as t
from libra_cli.status import with_leases


def row(name: str, port: int) -> dict:
    return {"name": name, "pid": 1, "address": f"127.0.0.1:{port}", "health": "SERVING"}


def lease(worker_id: str, role: t.WorkerRole, address: str, epoch: int) -> t.Lease:
    return t.Lease(t.WorkerId(worker_id), role, "short", address, epoch, 0, 3_000)


def test_rows_gain_role_epoch_and_bucket_by_worker_id_or_address() -> None:
    rows = with_leases(
        [row("rollout-0", 7001), row("trainer", 7002), row("scheduler", 7003)],
        [lease("rollout-0", t.WorkerRole.HYBRID_JOINING, "10.0.0.9:1", 12),
         lease("trainer-0", t.WorkerRole.CORE_TRAINING, "127.0.0.1:7002", 3)])
    got = {r["name"]: (r["worker_id"], r["role"], r["epoch"], r["bucket"]) for r in rows}
    assert got == {"rollout-0": ("rollout-0", "hybrid-joining", 12, "short"),
                   "trainer": ("trainer-0", "core-training", 3, "short"),
                   "scheduler": ("", "", 0, "")}
