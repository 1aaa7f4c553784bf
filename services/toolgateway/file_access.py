"""Opening files for a job with an unprivileged identity, never the gateway's own.

Where it sits: the ``search`` tool opens a job's corpus files (``tools.search_corpus``)
through :class:`JobFileReader`. The gateway often runs as root (containers), and root
reads any file, so a file inside a data root that only root may read (a key, a copied
``/etc/shadow``) would otherwise reach a job's transcript.

How: when the gateway runs as root, a forked child drops to ``uid``/``gid`` with no
supplementary groups (``setgroups([])``, ``setgid``, ``setuid``: gid first, as after
``setuid`` it could no longer change), opens each file there and passes the open file
descriptors back over a Unix socket (``SCM_RIGHTS``); the parent reads them. So the
kernel's permission check at ``open`` is the unprivileged one, and no interpreter is
exec'd (it may live where that uid cannot reach, e.g. under ``/root``). The child does
no imports and no logging, and always ends with ``os._exit``.

Each received descriptor's real path (``/proc/self/fd/N``) must lie inside the data
roots: a symlink swapped in after the roots check cannot lead out. Only regular files
are opened (``O_NONBLOCK``, so a FIFO cannot hang the open).

When the gateway is not root it cannot change identity: files are opened in-process as
its own (already unprivileged) user, with the same checks.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
# One message per file: b"F" with the descriptor, or b"E<errno>" naming why not.
_MESSAGE_BYTES = 64
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK


@dataclass(frozen=True, kw_only=True, slots=True)
class FileReaderConfig:
    """Who opens a job's files, and bounds on what is read."""

    uid: int = NOBODY
    """Identity the files are opened as when the gateway runs as root; -1 opens them as
    the gateway itself (no privilege drop)."""
    gid: int = NOBODY
    """Group of that identity (no supplementary groups)."""
    max_file_bytes: int = 256 * 1024 * 1024
    """A larger file is refused (EFBIG) before it is read."""
    open_timeout_s: float = 30.0
    """How long the child may take to open every file (a hung network mount)."""


class JobFileReader:
    """Reads the text of files a job names, as an unprivileged identity (see module doc)."""

    def __init__(self, roots: Sequence[Path], config: FileReaderConfig | None = None) -> None:
        self._roots = tuple(roots)
        self._config = config or FileReaderConfig()
        self.drops_privileges = os.geteuid() == 0 and self._config.uid >= 0

    def hint(self, exc: OSError) -> str:
        """What to do about a refused open, for the tool's error ("" when nothing
        helps): the file or a folder above it is not readable to the reader's uid."""
        if exc.errno != errno.EACCES or not self.drops_privileges:
            return ""
        return (f" (opened as uid {self._config.uid}, not root: make the file and its "
                "folders readable to that uid, or set the gateway's file_read_uid)")

    def read_texts(self, paths: Sequence[str]) -> list[str]:
        """The UTF-8 text of each file, in order.

        Raises:
            OSError: A file cannot be opened by the reader's identity (EACCES, ENOENT,
                ...), is not a regular file (EINVAL), is too large (EFBIG) or resolved
                outside the data roots (EPERM); ``filename`` names it.
            UnicodeDecodeError: A file is not UTF-8.
        """
        fds = self._open_all(paths)
        try:
            return [self._read(fd, path) for fd, path in zip(fds, paths, strict=True)]
        finally:
            for fd in fds:
                os.close(fd)

    def _open_all(self, paths: Sequence[str]) -> list[int]:
        if not self.drops_privileges:
            fds: list[int] = []
            try:
                for path in paths:
                    fds.append(_open_regular(path))
            except OSError:
                for fd in fds:
                    os.close(fd)
                raise
            return fds
        return _open_as(paths, self._config.uid, self._config.gid, self._config.open_timeout_s)

    def _read(self, fd: int, path: str) -> str:
        real = os.readlink(f"/proc/self/fd/{fd}")
        if not any(Path(real).is_relative_to(root) for root in self._roots):
            raise OSError(errno.EPERM, f"opened {real}, outside the data roots", path)
        size = os.fstat(fd).st_size
        if size > self._config.max_file_bytes:
            raise OSError(errno.EFBIG, f"{size} bytes > {self._config.max_file_bytes}", path)
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(self._config.max_file_bytes + 1).decode("utf-8")


def _open_regular(path: str) -> int:
    """Open ``path`` read-only; refuse anything but a regular file (EINVAL)."""
    fd = os.open(path, _OPEN_FLAGS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return fd


def _open_as(paths: Sequence[str], uid: int, gid: int, timeout_s: float) -> list[int]:
    """Open every path in a child running as ``uid``/``gid``; their descriptors here."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    encoded = [os.fsencode(path) for path in paths]  # nothing to allocate in the child
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; coverage cannot follow a fork
        parent.close()
        _child(child, encoded, uid, gid)
    child.close()
    fds: list[int] = []
    try:
        parent.settimeout(timeout_s)
        for path in paths:
            message, received, _flags, _addr = socket.recv_fds(parent, _MESSAGE_BYTES, 1)
            fds.extend(received)
            if not message.startswith(b"F") or len(received) != 1:
                code = int(message[1:] or errno.EIO)
                raise OSError(code, os.strerror(code), path)
        return fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        parent.close()
        _reap(pid)


def _child(sock: socket.socket, paths: list[bytes], uid: int, gid: int) -> None:
    """In the forked child: drop privileges, open, send, exit (never returns)."""
    status = 1
    try:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        for path in paths:
            try:
                fd = _open_regular(os.fsdecode(path))
            except OSError as exc:
                sock.send(b"E%d" % (exc.errno or errno.EIO))
                break
            socket.send_fds(sock, [b"F"], [fd])
            os.close(fd)
        status = 0
    finally:
        os._exit(status)


def _reap(pid: int) -> None:
    """Kill and wait for the child: every answer is in (or it timed out), so whatever
    it still does is of no use; a kill of an exited child is harmless."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
