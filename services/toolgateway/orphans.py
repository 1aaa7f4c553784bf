"""Reaping what tool calls leave behind, whichever process is PID 1.

Where it sits: the gateway's ``run()`` (``python -m services.toolgateway``) calls
``adopt_orphans`` once; ``SubprocessSandbox`` owns an ``OrphanReaper`` and reaps before
and after each call, where this process receives orphans (a process that only embeds the
sandbox, such as a test or the in-process loop, leaves them to its init). Between calls
the gateway's server runs ``reap_every``: a leftover that exits after its call ended
would otherwise stay a zombie until the next call, which an idle gateway may not get
for hours (its pid taken, its uid kept out of the pool).

Why: a tool's descendants that outlive it (a double fork, a ``setsid``) are re-parented to
the nearest child subreaper, else to PID 1 of the PID namespace. Killed with the call's
uid, each stays a zombie until that process waits for it, and a zombie still holds a pid
and counts against its uid's RLIMIT_NPROC (so UidPool keeps the uid out). Who PID 1 is
depends on the deployment: tini from the image's ENTRYPOINT in compose and Kubernetes,
the gateway itself where a manifest's ``command`` replaces that entrypoint, the host's
init on bare metal, or a dev container's ``sleep infinity`` that never reaps. So the
gateway adopts its tools' orphans itself (a child subreaper, ``prctl``) and reaps them:
the pool gets its uids back in every deployment, not only where PID 1 is a good init.

Which zombies: only children of this process outside its session. What the gateway starts
for itself (the file reader's fork, the isolation probe, the uid kill helper) stays in its
session and has a waiter of its own; a tool starts a new session, so every descendant of
a tool is outside ours. The one such child that is waited for is the tool process itself
(asyncio's watcher): it is spared from its spawn until it is gone. A blanket
``waitpid(-1)`` would take exit statuses that asyncio and ``subprocess`` wait for (they
then report 255 or 0). A plugin tool that starts its own process in a new session from
inside the gateway would need the same sparing; none does.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_LIBC = ctypes.CDLL(None, use_errno=True)


def adopt_orphans() -> bool:
    """Make this process the one its descendants' orphans go to; False if it cannot.

    PID 1 of a namespace gets them anyway; any other process becomes a child subreaper
    (Linux 3.4+, no privilege needed).
    """
    if receives_orphans():
        return True
    if _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        logger.warning("[startup] cannot become a child subreaper (errno %d): orphaned tool "
                       "processes are left to PID 1", ctypes.get_errno())
        return False
    return True


def receives_orphans() -> bool:
    """Whether orphaned descendants are re-parented to this process."""
    if os.getpid() == 1:
        return True
    flag = ctypes.c_int(0)
    return _LIBC.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 \
        and flag.value != 0


def _children() -> dict[int, tuple[str, int]]:
    """pid -> (state, session) of every child of this process, from ``/proc/<pid>/stat``."""
    me, found = os.getpid(), {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                # After the last ')': state ppid pgrp session (the name may hold ')').
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        if int(fields[1]) == me:
            found[int(name)] = (fields[0].decode(), int(fields[3]))
    return found


class OrphanReaper:
    """Waits for the zombies this process adopted, sparing the tool processes it spawned.

    Used from the event loop's thread only: ``reap`` does not await, so no spawn can
    start in the middle of it, and one in progress makes it skip (the child may already
    be a zombie before asyncio knows its pid). It reaps only while this process receives
    orphans, asked at each reap (one ``prctl``), so adopting them may come after the
    sandbox is built.
    """

    def __init__(self) -> None:
        self._spared: set[int] = set()
        self._num_spawning = 0

    @contextlib.contextmanager
    def spawning(self) -> Iterator[set[int]]:
        """Around a spawn of a child in a new session; add its pid to the yielded set."""
        self._num_spawning += 1
        try:
            yield self._spared
        finally:
            self._num_spawning -= 1

    def reap(self) -> int:
        """Wait for every adopted zombie; how many were reaped."""
        if self._num_spawning or not receives_orphans():
            return 0
        children, own_session = _children(), os.getsid(0)
        self._spared &= children.keys()  # a spared tool its waiter has reaped is gone
        num_reaped = 0
        for pid, (state, session) in children.items():
            if state != "Z" or session == own_session or pid in self._spared:
                continue
            with contextlib.suppress(ChildProcessError):  # reaped by someone meanwhile
                num_reaped += os.waitpid(pid, os.WNOHANG)[0] == pid
        return num_reaped


async def reap_every(reaper: OrphanReaper, interval_s: float) -> None:
    """Reap ``reaper``'s adopted zombies every ``interval_s`` until cancelled (the
    gateway's server starts and stops it: ``serve``'s ``run``). On the event loop's
    thread, as ``OrphanReaper`` requires."""
    while True:
        await asyncio.sleep(interval_s)
        reaper.reap()
