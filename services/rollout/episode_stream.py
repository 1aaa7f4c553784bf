"""What the external agent does while an engine call samples its episodes' turns (pure;
the Redis side is the agent's episode channel):

- **streaming**: a call with ``stream=true`` gets its turn's text as the engine samples
  it. The engine hands each step's (row, token) pairs to a sink (``token_sink``, called
  from its decode thread); they cross to the event loop through a queue, and one relay
  task sends each episode's new text as a delta reply (``EpisodeReply.is_delta``) on the
  episode's reply list. Whatever piled up while a send was in flight goes out as one
  delta, so the granularity is an engine step or coarser, never a blocking cost to the
  engine. Only text the final reply will start with is sent: the text before a tool
  call's tag or a stop string, stripped as the parser strips content, with a tail that
  may still become such a tag held back (the endpoint sends the rest with the final
  reply);
- **gone clients**: an episode whose call was aborted (its client went away) has its
  engine row stopped at the next token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from libra import episodes as ep
from libra.chat.toolcalls import TOOL_CALL_OPEN


class RowAborter(Protocol):
    """The engine's per-row stop (both engines have it)."""

    def abort_rows(self, rows: Iterable[int]) -> None: ...


class DeltaSender(Protocol):
    async def reply(self, episode_id: str, reply: ep.EpisodeReply, ttl_s: float) -> None: ...

    async def aborted(self, episode_ids: list[str]) -> dict[str, list[int]]: ...


@dataclass
class TurnStream:
    """A streamed call's turn on this instance: its tokens so far and the text sent."""

    call_index: int
    stops: tuple[str, ...] = ()
    ids: list[int] = field(default_factory=list)
    sent: str = ""

    def take(self, token_ids: Sequence[int], decode: Callable[[list[int]], str]) -> str:
        """The text to send after these tokens ("" while nothing new may go out)."""
        self.ids.extend(token_ids)
        safe = streamable_text(decode(self.ids), self.stops)
        if not safe.startswith(self.sent):  # a token completed an earlier character
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` before the first of ``stops`` it holds (all of it when none)."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def streamable_text(text: str, stops: Sequence[str]) -> str:
    """The part of a turn's text that the final reply's content starts with: before a
    tool call's tag or a stop string, stripped, less a tail that may begin one."""
    text = cut_at_stop(text, (TOOL_CALL_OPEN, *stops)).lstrip()
    cut = len(text)
    for tag in (TOOL_CALL_OPEN, *stops):
        for size in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:size]):
                cut = min(cut, len(text) - size)
                break
    return text[:cut].rstrip()


@dataclass
class EngineCallWatch:
    """One engine call's relay and abort watch over its rows (row i: ``episodes[i]``,
    the episode id, and ``streams[i]``, its TurnStream when its call streams)."""

    channel: DeltaSender
    engine: Any
    episodes: list[str]
    streams: dict[int, TurnStream]
    call_indices: dict[str, int]
    """Episode id -> the call its turn answers (0: unknown, after a move)."""
    decode: Callable[[list[int]], str]
    on_gone: Callable[[str], None]
    ttl_s: float
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def start(self) -> None:
        """Hand the engine the sink (before its call starts, so no token is missed)."""
        if hasattr(self.engine, "token_sink"):
            loop = asyncio.get_running_loop()
            self.engine.token_sink = (
                (lambda pairs: loop.call_soon_threadsafe(self._queue.put_nowait, pairs))
                if self.streams else None)

    async def run(self, poll_s: float) -> None:
        """Relay deltas and stop gone clients' rows until cancelled (the call ended)."""
        tasks = [asyncio.create_task(self._watch_aborts(poll_s))]
        if self.streams:
            tasks.append(asyncio.create_task(self._relay()))
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def _relay(self) -> None:
        while True:
            pairs = list(await self._queue.get())
            while not self._queue.empty():  # sent while the last delta was in flight
                pairs += self._queue.get_nowait()
            by_row: dict[int, list[int]] = {}
            for row, token_id in pairs:
                by_row.setdefault(row, []).append(token_id)
            for row, token_ids in by_row.items():
                stream = self.streams.get(row)
                delta = stream.take(token_ids, self.decode) if stream is not None else ""
                if delta and stream is not None:
                    await self.channel.reply(self.episodes[row], ep.EpisodeReply(
                        call_index=stream.call_index, content=delta, is_delta=True),
                        self.ttl_s)

    async def _watch_aborts(self, poll_s: float) -> None:
        waiting = {episode_id: row for row, episode_id in enumerate(self.episodes)}
        while waiting:
            await asyncio.sleep(poll_s)
            aborted = await self.channel.aborted(list(waiting))
            for episode_id, indices in aborted.items():
                index = self.call_indices.get(episode_id, 0)
                if index in indices or not index:
                    self.on_gone(episode_id)
                    self.engine.abort_rows([waiting.pop(episode_id)])
