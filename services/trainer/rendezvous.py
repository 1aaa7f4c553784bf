"""Where a job's data-parallel ranks meet: a torch.distributed ``TCPStore`` at a known address.

Rank 0 (the trainer service) listens on the configured port for as long as it runs: one
store for every job, because a store per job could not listen on the port again while the
last one's server is still referenced (the group and the DDP wrapper hold it until they
are collected): EADDRINUSE.
Each job is a *generation* of that store: rank 0 publishes the job's
:class:`GroupSettings` under the next generation number, then bumps the counter, waits
until every rank has checked in, and forms the process group over a prefix of the store
that belongs to that generation only. Ranks 1..N-1 need nothing but the address and their
rank: they wait for an open generation, read the job from it and join. A rank that never
joins fails the job after ``timeout_s`` with an error naming the address and the missing
ranks, instead of torch's anonymous store timeout.

Keys (under ``libra/``; torch's group keys go under ``libra/<gen>/pg/``): ``generation``
(a counter), ``<gen>/settings`` (JSON), ``<gen>/joined/<rank>`` (a counter each rank adds
1 to: a second process claiming the same rank sees 2 and stops), ``<gen>/closed`` (the
job's group is done: ranks that come back wait for the next generation).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

GENERATION_KEY = "libra/generation"
# Rank 0 re-reads the joined counters, and a waiting rank the generation, this often.
POLL_S = 0.1


def _key(generation: int, name: str) -> str:
    return f"libra/{generation}/{name}"


class RendezvousTimeout(RuntimeError):
    """Not every rank joined within the timeout."""


class NoJobYet(TimeoutError):
    """A rank found the store but no open job within its timeout (idle between jobs)."""


@dataclass(frozen=True)
class GroupSettings:
    """What every rank needs to build the job's backend; published by rank 0."""

    world_size: int
    spec_json: str
    model_dir: str
    num_threads: int
    parallelism: str
    device: str
    timeout_s: float

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> GroupSettings:
        return cls(**json.loads(text))


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); ValueError naming the address otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"rendezvous address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


def open_store(port: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0's store on ``port`` (0: a free one), listening on every interface.

    The master connects to its own server too, over loopback; remote ranks use whatever
    name or address reaches this host (the Kubernetes Service, the node's address)."""
    return dist.TCPStore("127.0.0.1", port, is_master=True,
                         timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def begin(store: dist.TCPStore, settings: GroupSettings) -> int:
    """Publish a job as the next generation (settings first, so a rank that sees the new
    number finds them); returns the generation."""
    generation = store.add(GENERATION_KEY, 0) + 1
    store.set(_key(generation, "settings"), settings.to_json())
    store.add(GENERATION_KEY, 1)
    return generation


def group_store(store: dist.TCPStore, generation: int) -> dist.PrefixStore:
    """The part of the store a generation's process group keys live in."""
    return dist.PrefixStore(_key(generation, "pg/"), store)


def wait_for_ranks(store: dist.TCPStore, generation: int, address: str, world_size: int,
                   timeout_s: float, check_alive: Callable[[], None] = lambda: None) -> None:
    """Block until ranks 1..world_size-1 have joined; RendezvousTimeout names the missing.

    ``check_alive`` runs every poll and may raise (locally spawned ranks that died)."""
    deadline = time.monotonic() + timeout_s
    expected = list(range(1, world_size))
    while True:
        missing = [r for r in expected if not store.check([_key(generation, f"joined/{r}")])]
        if not missing:
            return
        check_alive()
        if time.monotonic() >= deadline:
            joined = [rank for rank in expected if rank not in missing]
            raise RendezvousTimeout(
                f"trainer rendezvous at {address}: rank(s) {missing} of {world_size} did not"
                f" join within {timeout_s:g}s (joined: {[0, *joined]}); start each missing"
                f" rank with `python -m services.trainer.rank --rendezvous {address}"
                f" --rank <rank>`")
        time.sleep(POLL_S)


def end(store: dist.TCPStore, generation: int) -> None:
    """Mark a job's group done (ranks coming back wait for the next generation)."""
    store.set(_key(generation, "closed"), "1")


def _open_generation(store: dist.TCPStore, timeout_s: float) -> int | None:
    """The newest generation still open, waiting up to ``timeout_s`` for one."""
    deadline = time.monotonic() + timeout_s
    while True:
        generation = store.add(GENERATION_KEY, 0)
        if generation and not store.check([_key(generation, "closed")]):
            return generation
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S * 5)


def join(address: str, rank: int, timeout_s: float
         ) -> tuple[dist.PrefixStore, GroupSettings]:
    """Rank ``rank`` (>= 1) checks in at ``address`` for the open job; returns its group's
    store and settings.

    Raises DistNetworkError when no store answers within ``timeout_s``, NoJobYet when
    no job opens within it, ValueError for a rank outside the group or taken."""
    host, port = split_address(address)
    store = dist.TCPStore(host, port, is_master=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    generation = _open_generation(store, timeout_s)
    if generation is None:
        raise NoJobYet(f"trainer rendezvous at {address}: no job within {timeout_s:g}s")
    settings = GroupSettings.from_json(store.get(_key(generation, "settings")).decode())
    if not 1 <= rank < settings.world_size:
        raise ValueError(f"trainer rendezvous at {address}: rank {rank} is outside the group"
                         f" (ranks 1..{settings.world_size - 1} join rank 0)")
    if store.add(_key(generation, f"joined/{rank}"), 1) != 1:
        raise ValueError(f"trainer rendezvous at {address}: rank {rank} joined twice (two"
                         f" processes were given the same rank)")
    return group_store(store, generation), settings
