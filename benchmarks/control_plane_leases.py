"""The synthetic fleet's leases (benchmarks/control_plane_fleet.py): each driver
process holds a slice of the instances' leases and renews them on a thread and event
loop of their own (``Leases.run``), through the real ``GrpcCoordinatorClient``; and the
helpers both halves of the fleet share (instance ids, buckets, percentiles)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.errors import LeaseLost, LibraError
from libra.lease_timing import renewal_wait_s

if TYPE_CHECKING:
    from benchmarks.control_plane_fleet import Control


def instance_id(index: int) -> str:
    return f"synthetic-{index:05d}"


def bucket_of(index: int, buckets: list[str]) -> str:
    return buckets[index % len(buckets)]


def percentiles_ms(samples_s: list[float]) -> dict[str, float]:
    """p50, p99 and max in ms (all 0.0 without samples)."""
    if not samples_s:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    lat = sorted(samples_s)
    pick = lambda q: round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 2)  # noqa: E731
    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(1000 * lat[-1], 2)}


class Leases:
    """The leases of a slice of instances: AcquireLease, then RenewLease every TTL/3 (the
    rollout ``LeaseKeeper``'s cadence); a lost lease is acquired again (a new epoch) and
    the instance drops what it held, as the rollout core does."""

    def __init__(self, cfg: dict[str, Any], control: Control) -> None:
        self.cfg, self.control = cfg, control
        self.clients: list[GrpcCoordinatorClient] = []  # on the leases' loop (``run``)
        self.epochs: dict[str, int] = {}
        self.ttl_ms: dict[str, int] = {}  # as granted (the coordinator may raise it)
        # The first ``kill`` of the slice die at the mark.
        self.killed = {instance_id(i) for i in self.indexes()[:cfg.get("kill", 0)]}
        self.lat_s: list[float] = []
        self.lost = self.lost_total = self.lost_registering = self.renew_errors = 0
        self.calls = 0  # renewal RPCs in the window (batched: one per beat)
        self.reacquiring: set[str] = set()  # batched: lost, being acquired again
        self.tasks: set[asyncio.Task[None]] = set()
        self.on_lost: Any = None  # called with the instance id
        # When each lease was last granted or renewed (perf_counter), and every lapse:
        # seconds after this process was ready (negative: while registering), the TTL
        # held, ms since the last grant or renewal. Says when and why leases lapsed.
        self.renewed_at: dict[str, float] = {}
        self.ready_at: float | None = None
        self.lapses: list[tuple[float, int, int]] = []

    def indexes(self) -> range:
        return range(self.cfg["first"], self.cfg["first"] + self.cfg["count"])

    async def acquire(self, index: int) -> None:
        lease = await self.clients[index % len(self.clients)].acquire_lease(
            instance_id(index), t.WorkerRole.CORE_ROLLOUT, bucket_of(index, self.cfg["buckets"]),
            "127.0.0.1:1", self.cfg["ttl_ms"])
        self.epochs[lease.worker_id] = lease.epoch
        self.ttl_ms[lease.worker_id] = lease.ttl_ms
        self.renewed_at[lease.worker_id] = time.perf_counter()

    def note_lapse(self, worker: str) -> None:
        now = time.perf_counter()
        self.lost_registering += self.ready_at is None
        since_ready = now - (self.ready_at if self.ready_at is not None else now)
        self.lapses.append((round(since_ready, 2), self.ttl_ms[worker],
                            round(1000 * (now - self.renewed_at[worker]))))

    async def acquire_again(self, index: int) -> bool:
        try:
            await self.acquire(index)
            return True
        except LibraError:  # the next beat renews at the old epoch: LeaseLost again
            self.renew_errors += 1
            return False

    async def acquire_all(self) -> list[asyncio.Task[None]]:
        """Every lease, each renewed from its grant on (as ``LeaseKeeper``: a 3 s lease
        granted first must not wait for the 500th grant); the renewal tasks. With
        ``renewals`` "batched" (the default) a task per 100 instances renews them with
        RenewLeases, the groups a tenth of the period apart; with "single" each instance
        renews its own with RenewLease."""
        indexes, keepers = self.indexes(), []
        batched = self.cfg.get("renewals", "batched") == "batched"
        for lo in range(0, len(indexes), 100):  # in slices: 1,000 at once is no host's start
            await asyncio.gather(*(self.acquire(i) for i in indexes[lo:lo + 100]))
            if not batched:
                keepers += [asyncio.create_task(self.keep(i)) for i in indexes[lo:lo + 100]]
            else:
                group = [instance_id(i) for i in indexes[lo:lo + 100]]
                keepers.append(asyncio.create_task(self.keep_batched(group, lo // 100 % 10)))
        return keepers

    def dead(self, worker: str) -> bool:
        """Killed at the mark: it neither renews nor works from then on."""
        return self.control.marked.is_set() and worker in self.killed

    async def keep(self, index: int) -> None:
        worker = instance_id(index)
        client = self.clients[index % len(self.clients)]
        # Renewals spread over the period, as instances that started apart do.
        await asyncio.sleep(self.ttl_ms[worker] / 3000 * ((index - self.cfg["first"]) % 100)
                            / 100)
        num_failed = 0
        while not self.control.stopped.is_set() and not self.dead(worker):
            began = time.perf_counter()
            try:
                lease = await client.renew_lease(worker, self.epochs[worker])
                self.ttl_ms[worker] = lease.ttl_ms
                self.renewed_at[worker] = time.perf_counter()
                num_failed = 0
                if self.control.marked.is_set():
                    self.lat_s.append(time.perf_counter() - began)
            except LeaseLost:
                self.note_lapse(worker)
                self.lost += self.control.marked.is_set()
                self.lost_total += 1  # the fill included
                if await self.acquire_again(index) and self.on_lost is not None:
                    self.on_lost(worker)
            except LibraError:  # no answer: try again soon, as LeaseKeeper does
                self.renew_errors += 1
                num_failed += 1
            await asyncio.sleep(renewal_wait_s(self.ttl_ms[worker], num_failed,
                                               time.perf_counter() - began))

    async def keep_batched(self, group: list[str], phase: int) -> None:
        """Renew a group of the slice's leases in one RenewLeases call every third of
        the shortest granted TTL, as one rollout host holding many leases would. Groups
        of 100, ``phase`` tenths of the period apart, so that no single beat decodes all
        500 answers of a driver on the loop that also times its probes. A lost lease
        (GONE or FENCED in its answer) is acquired again on its own task, left out of the
        batches meanwhile (re-acquiring them one after another here held the next batch
        back for seconds under load: more lapses), and its instance drops what it held.
        Each renewal counts once, as in ``keep``."""
        await asyncio.sleep(min(self.ttl_ms[w] for w in group) / 3000 * phase / 10)
        num_failed = 0
        while not self.control.stopped.is_set():
            began = time.perf_counter()
            ttl_ms = min(self.ttl_ms[w] for w in group)
            held = [t.LeaseRef(w, self.epochs[w]) for w in group
                    if not self.dead(w) and w not in self.reacquiring]
            try:
                renewals = await self.clients[phase % len(self.clients)].renew_leases(held)
                num_failed = 0
            except LibraError:  # no answer: try again soon, as LeaseKeeper does
                self.renew_errors += 1
                num_failed += 1
                renewals = []
            if self.control.marked.is_set():
                self.lat_s.extend([time.perf_counter() - began] * len(renewals))
                self.calls += 1
            for renewal in renewals:
                if renewal.lease is not None:
                    self.ttl_ms[renewal.worker_id] = renewal.lease.ttl_ms
                    self.renewed_at[renewal.worker_id] = began
                    continue
                self.note_lapse(renewal.worker_id)
                self.lost += self.control.marked.is_set()
                self.lost_total += 1
                self.reacquiring.add(renewal.worker_id)
                task = asyncio.create_task(self.reacquire(renewal.worker_id))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            await asyncio.sleep(renewal_wait_s(ttl_ms, num_failed, time.perf_counter() - began))

    async def reacquire(self, worker: str) -> None:
        """A lost lease acquired again (tried again each beat until granted)."""
        index = int(worker.rsplit("-", 1)[1])
        while not await self.acquire_again(index):
            if self.control.stopped.is_set():
                return
            await asyncio.sleep(min(self.ttl_ms.values()) / 3000)
        self.reacquiring.discard(worker)
        if self.on_lost is not None:
            self.on_lost(worker)

    async def run(self, ready: threading.Event) -> dict[str, Any]:
        """Acquire every lease, set ``ready``, renew until stopped; the summary. Runs on
        a thread and event loop of its own (``main``): the driver stands in for 500
        hosts, each renewing its lease apart from its work, while one loop for all
        would put each renewal behind 500 instances' reports and inbox reads (loop lag
        of seconds, leases lapsed that no host of one instance would lose)."""
        self.clients = [GrpcCoordinatorClient(self.cfg["coordinator"])
                        for _ in range(self.cfg["channels"])]
        keepers = await self.acquire_all()
        self.ready_at = time.perf_counter()
        ready.set()
        await asyncio.gather(*keepers)
        return await self.close()

    async def close(self) -> dict[str, Any]:
        for client in self.clients:
            await client.close()
        calls = self.calls if self.cfg.get("renewals", "batched") == "batched" \
            else len(self.lat_s)
        return {"renewals": len(self.lat_s), "renew_calls": calls, "lost": self.lost,
                "lost_total": self.lost_total,
                "lost_registering": self.lost_registering,
                "renew_errors": self.renew_errors, "killed": sorted(self.killed),
                "ttl_ms_max": max(self.ttl_ms.values(), default=0),
                "lapses": self.lapses[:50],
                **{f"renew_{k}": v for k, v in percentiles_ms(self.lat_s).items()}}
