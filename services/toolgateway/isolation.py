"""Linux isolation for the sandbox's child: namespaces, private mounts, limits, uids.

Everything here runs either once per process (``probe_isolation``) or in the child
between fork and exec (``child_setup``), which is why the libc handle is loaded at import:
the child must not dlopen. The order of the steps and why each exists: sandbox.py's
docstring. Apart from it so the sandbox module reads as the call's life cycle.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import resource
from dataclasses import dataclass

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
# Loaded before any fork: the child must not dlopen (it may hold loader locks).
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]


class IsolationUnavailable(RuntimeError):
    """A required isolation feature is not supported by this kernel or user."""


@dataclass(frozen=True, slots=True)
class IsolationSupport:
    """What this host allows, probed once per process."""

    is_root: bool
    has_netns: bool
    has_mountns: bool


def _probe_unshare(flags: int) -> bool:
    pid = os.fork()
    if pid == 0:  # child: report by exit status only
        os._exit(0 if _LIBC.unshare(flags) == 0 else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@functools.cache
def probe_isolation() -> IsolationSupport:
    """Detect once whether namespaces work here (a forked child tries ``unshare``)."""
    return IsolationSupport(
        is_root=os.geteuid() == 0,
        has_netns=_probe_unshare(CLONE_NEWNET),
        has_mountns=_probe_unshare(CLONE_NEWNS),
    )


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """Everything the child needs, computed in the parent (the child must not allocate much)."""

    unshare_flags: int
    workdir: str
    masked_dirs: tuple[str, ...]
    tmpfs_options: bytes
    prefix_src: str | None
    prefix_dst: str | None
    limits: tuple[tuple[int, int], ...]
    uid: int | None


def _mount(src: str | None, target: str, fstype: str | None, flags: int,
           data: bytes | None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    if _LIBC.mount(enc(src), enc(target), enc(fstype), flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _setup_mounts(plan: ChildPlan) -> None:
    # Private propagation first, or our tmpfs mounts would leak into the host namespace.
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE, None)
    for path in plan.masked_dirs:
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, plan.tmpfs_options)
    if plan.prefix_src and plan.prefix_dst:
        os.makedirs(plan.prefix_dst)
        _mount(plan.prefix_src, plan.prefix_dst, None, _MS_BIND | _MS_REC, None)
    if not os.path.isdir(plan.workdir):
        # The cwd (set before preexec) still points at the real dir under the new tmpfs.
        os.makedirs(plan.workdir)
        _mount(".", plan.workdir, None, _MS_BIND, None)
    os.chdir(plan.workdir)


def child_setup(plan: ChildPlan) -> None:
    """Runs in the child between fork and exec; an exception aborts the spawn."""
    if plan.unshare_flags and _LIBC.unshare(plan.unshare_flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare failed")
    if plan.unshare_flags & CLONE_NEWNS:
        _setup_mounts(plan)
    for which, value in plan.limits:
        resource.setrlimit(which, (value, value))
    if plan.uid is not None:  # gid before uid: after setuid we may no longer change gid
        os.setgroups([])
        os.setgid(plan.uid)
        os.setuid(plan.uid)


def uids_with_processes(first_uid: int, num_uids: int) -> set[int]:
    """The uids in ``[first_uid, first_uid + num_uids)`` that some process still has as
    its real uid, zombies included: a zombie counts against its uid's RLIMIT_NPROC until
    its parent reaps it. Read from ``/proc/<pid>/status`` (not the owner of
    ``/proc/<pid>``, which is root for a process that made itself non-dumpable)."""
    found: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                uid = next(int(line.split()[1]) for line in f if line.startswith(b"Uid:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue  # exited meanwhile
        if first_uid <= uid < first_uid + num_uids:
            found.add(uid)
    return found


class UidPool:
    """Hands out distinct uids so concurrent calls never share one.

    Each uid in use is also held with a host-wide ``flock`` on a lock file, so other
    sandboxes on this host (another gateway, a test run) skip it: their cleanup
    (``kill -KILL -1`` as that uid) would otherwise kill this call's processes.

    A uid that still has a process, even a killed one not yet reaped, is skipped too
    (quarantined until it has none): its processes count against the next call's
    RLIMIT_NPROC, so a call after a fork bomb failed its own first fork with EAGAIN.
    SIGKILL takes effect asynchronously, and a killed orphan is a zombie until the
    process that adopted it reaps it (the gateway itself: orphans.py). The check reads
    every process's status: 2.3 ms for 85 processes on a loaded 2-core host, small
    beside the interpreter start it precedes.
    """

    def __init__(self, base: int, size: int, lock_dir: str) -> None:
        self._base, self._size = base, size
        self._free = list(range(base + size - 1, base - 1, -1))
        self._lock_dir = lock_dir
        self._held: dict[int, int] = {}
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)

    def acquire(self) -> int:
        """A free uid with no process left: the lowest one.

        Raises:
            RuntimeError: every uid is in use on this host or still has processes.
        """
        lingering = uids_with_processes(self._base, self._size)
        uid = self._take_first_free(lingering)
        if uid is None:
            raise RuntimeError(
                f"sandbox uid pool exhausted: every uid is in use on this host or still "
                f"has processes ({len(lingering)} of {self._size}); raise "
                "SandboxConfig.num_uids")
        return uid

    def _take_first_free(self, lingering: set[int]) -> int | None:
        for i in range(len(self._free) - 1, -1, -1):
            uid = self._free[i]
            if uid in lingering:
                continue
            fd = os.open(os.path.join(self._lock_dir, f"uid-{uid}.lock"),
                         os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # in use by another sandbox on this host
                os.close(fd)
                continue
            del self._free[i]
            self._held[uid] = fd
            return uid
        return None

    def release(self, uid: int) -> None:
        os.close(self._held.pop(uid))  # closing the fd drops the flock
        self._free.append(uid)
