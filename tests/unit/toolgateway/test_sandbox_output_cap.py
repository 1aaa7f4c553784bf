"""Past the output cap the rest of a pipe is read to EOF (services/toolgateway/output_pipe.py).

On Python 3.11 ``Process.wait()`` returns only once every pipe reached EOF. A reader that
stopped at the cap left the killed tool's output unread: the stream paused its pipe at its
high-water mark, EOF never came, and the call hung until its backstop (a spurious
``timeout`` with empty output, 1 call in 10-160 of a tool printing in a loop).
"""

from __future__ import annotations

import asyncio

from services.toolgateway.output_pipe import read_capped


class _Killer:
    def __init__(self) -> None:
        self.reasons: list[str | None] = []

    def kill(self, reason: str | None) -> None:
        self.reasons.append(reason)


async def test_overflow_keeps_the_cap_kills_once_and_reads_to_eof() -> None:
    stream = asyncio.StreamReader(limit=4096)
    stream.feed_data(b"y" * 1_000_000)  # far past the stream's high-water mark
    stream.feed_eof()
    buf, killer = bytearray(), _Killer()
    assert await read_capped(stream, buf, 4096, killer) is True
    assert bytes(buf) == b"y" * 4096
    assert killer.reasons == ["output limit exceeded"]
    assert stream.at_eof()  # nothing left unread: the pipe can reach EOF


async def test_output_under_the_cap_is_kept_whole() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data(b"42\n")
    stream.feed_eof()
    buf, killer = bytearray(), _Killer()
    assert await read_capped(stream, buf, 4096, killer) is False
    assert bytes(buf) == b"42\n" and killer.reasons == [] and stream.at_eof()
