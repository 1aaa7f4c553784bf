"""The sandboxed process's output pipes and the kill of its process group.

Split from sandbox.py, which spawns the process and waits for it: here is what reads its
stdout and stderr (capped, on pipes the sandbox owns rather than asyncio's: see
``OutputPipe``) and kills its process group when the cap is passed or the call ends.
"""

from __future__ import annotations

import asyncio
import os
import signal

READ_CHUNK_BYTES = 65536
TRUNCATION_MARKER = "\n...[truncated]"


class GroupKiller:
    """Kills the child's process group once and remembers the first reason."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.reason: str | None = None

    def kill(self, reason: str | None) -> None:
        if self.reason is None and reason is not None:
            self.reason = reason
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # group already gone


async def read_capped(stream: asyncio.StreamReader, buf: bytearray, cap_bytes: int,
                       killer: GroupKiller) -> bool:
    """Read into ``buf`` up to ``cap_bytes``; returns True (and kills) on overflow.

    Past the cap the rest is read and dropped until EOF. A reader that stopped there
    left what the killed process had written unread: the stream paused its pipe at its
    high-water mark, the pipe never reached EOF, and ``Process.wait()`` (which on 3.11
    waits for every pipe's EOF) hung until the call's backstop. It did, intermittently,
    for a tool printing in a loop (test_huge_output_is_cut_and_killed)."""
    overflow = False
    while chunk := await stream.read(READ_CHUNK_BYTES):
        if overflow:
            continue
        room = cap_bytes - len(buf)
        buf += chunk[:room]
        if len(chunk) > room:
            killer.kill("output limit exceeded")
            overflow = True
    return overflow


class OutputPipe:
    """One output stream of the child, on a pipe the sandbox owns.

    Not asyncio's subprocess pipe: on 3.11 ``Process.wait()`` waits for its EOF as well
    as for the exit, and the EOF is up to every process that inherited the write end;
    one that left the process group (``setsid``, a double fork) held the call until its
    backstop, reported as a timeout although the tool had exited. With the pipe ours,
    the exit and the EOF are separate events: the call waits for the exit, kills what
    is left, then gives the EOF a bounded time and closes the pipe itself."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # both close-on-exec; the spawn dup2s one
        self.buf = bytearray()
        self.reader: asyncio.Future[bool] | None = None
        self._transport: asyncio.ReadTransport | None = None

    def close_write_end(self) -> None:
        """Once the child has its copy: only processes of the call hold it then."""
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    async def start_reading(self, cap_bytes: int, killer: GroupKiller) -> None:
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader()
        pipe, self.read_fd = os.fdopen(self.read_fd, "rb", buffering=0), -1  # owns the fd
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(stream), pipe)
        self.reader = asyncio.ensure_future(read_capped(stream, self.buf, cap_bytes, killer))

    def close(self) -> None:
        """Stop reading and close both ends (idempotent)."""
        self.close_write_end()
        if self.reader is not None and not self.reader.done():
            self.reader.cancel()
        if self._transport is not None:
            self._transport.close()
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


def decode_output(buf: bytearray, is_truncated: bool) -> str:
    """The captured bytes as text (invalid UTF-8 replaced), marked when cut at the cap."""
    text = buf.decode("utf-8", errors="replace")
    return text + TRUNCATION_MARKER if is_truncated else text
