"""The agent endpoint's operations: open an episode, complete a call, close it (pure:
the Redis side is an :class:`EpisodeStore`, the HTTP side services/coordinator/agent_rest.py).

Auth: an episode's API key is a random secret returned once by ``open_episode``; only
its sha256 is stored, with the episode's TTL (idle timeout + margin, renewed at every
call), and it is deleted at close, so a key expires with its episode. An unknown or
expired key is ``Unauthenticated`` (401); a valid key naming another episode is
``NotFound`` (404), never a hint that the episode exists.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from libra import agents
from libra import episodes as ep
from libra.cancellation import raise_if_cancelled
from libra.clock import Clock
from libra.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unauthenticated,
    Unavailable,
)
from libra.jobspec import JobSpec, job_spec_from_json
from services.coordinator.episode_core import (
    ChatRequest,
    after_call,
    model_id,
    parse_request,
    plan_call,
    reply_error,
    whole_call,
)

logger = logging.getLogger(__name__)

# How long one wait for a reply blocks before the client's connection is checked again.
DISCONNECT_POLL_S = 0.2
# A reply may take this long (a long turn in a full batch, a weight reload, a rollout
# loading the job's model for its first episode) before the call answers 504.
REPLY_DEADLINE_MIN_S = 120.0
MAX_OPEN_WAIT_S = 60.0
# Jobs whose parsed spec the endpoint keeps (a job's spec never changes once submitted;
# the oldest is forgotten first, and read again if it comes back).
MAX_CACHED_SPECS = 64
# Key digests whose episode id the endpoint keeps (the oldest forgotten first). A key
# names one episode for its whole life, so only the state read says whether it is
# still valid: the state and the key's entry are written with one TTL and deleted
# together (episode_store.py), and a call reads the state anyway. Saves a Redis round
# trip per call.
MAX_CACHED_KEYS = 4096


class EpisodeStore(Protocol):
    async def job_spec_json(self, job_id: str) -> str | None: ...

    async def take_offer(self, job_id: str, wait_s: float,
                         idle_timeout_s: float) -> ep.EpisodeOffer | None: ...

    async def save(self, state: ep.EpisodeState) -> None: ...

    async def load(self, episode_id: str) -> ep.EpisodeState | None: ...

    async def episode_of_key(self, key_sha256: str) -> str | None: ...

    async def push_call(self, state: ep.EpisodeState, call: ep.EpisodeCall) -> None: ...

    async def pop_reply(self, episode_id: str, timeout_s: float) -> ep.EpisodeReply | None: ...

    async def forget(self, state: ep.EpisodeState) -> None: ...

    async def count(self, job_id: str, name: str) -> None: ...


class ClientGone(Exception):
    """The caller disconnected before its reply: the call was aborted."""


def key_digest(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


class EpisodeEndpoint:
    """Open, call and close episodes of jobs whose ``task.agent`` is ``external``."""

    def __init__(self, store: EpisodeStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        # Episodes with a call in flight here (one coordinator serves the endpoint).
        self._busy: set[str] = set()
        self._specs: dict[str, JobSpec] = {}  # parsed once per job, oldest first
        self._episode_ids: dict[str, str] = {}  # key digest -> episode id, oldest first
        self._cleanups: set[asyncio.Task] = set()  # aborts of streams left early

    async def open_episode(self, job_id: str, wait_s: float) -> ep.EpisodeGrant:
        """The next episode the scheduler admitted for ``job_id`` (waits up to ``wait_s``).

        Raises:
            NotFound: No such job.
            FailedPrecondition: The job's agent is not ``external``.
            InvalidArgument: ``wait_s`` out of (0, 60].
            Unavailable: Nothing admitted within ``wait_s`` (admission follows the job's
                staleness budget: ask again).
        """
        if not 0 < wait_s <= MAX_OPEN_WAIT_S:
            raise InvalidArgument("wait_s", f"must be in (0, {MAX_OPEN_WAIT_S:g}] seconds")
        spec = await self._spec(job_id)
        if spec.task.agent != agents.EXTERNAL:
            raise FailedPrecondition(f"job {job_id!r} runs task.agent = {spec.task.agent!r}; "
                                     "episodes are for task.agent = 'external'")
        offer = await self._store.take_offer(job_id, wait_s,
                                             spec.task.episode_idle_timeout_s)
        if offer is None:
            raise Unavailable(f"no episode admitted for job {job_id!r} within {wait_s:g} s "
                              "(admission follows the staleness budget): ask again")
        api_key = f"ep-{secrets.token_urlsafe(24)}"
        timeout_s = spec.task.episode_idle_timeout_s
        state = ep.EpisodeState(
            episode_id=offer.episode_id, job_id=job_id, model=model_id(spec),
            key_sha256=key_digest(api_key), idle_timeout_s=timeout_s,
            prompt_text=offer.prompt_text, created_at_ms=self._clock.now_ms())
        await self._store.save(state)
        logger.info("[episode] opened episode_id=%s job_id=%s", offer.episode_id, job_id)
        return ep.EpisodeGrant(offer.episode_id, job_id, api_key, state.model,
                               offer.prompt_text, offer.prompt_messages_json, timeout_s)

    async def _spec(self, job_id: str) -> JobSpec:
        """The job's spec, parsed once per job (a job's spec never changes)."""
        spec = self._specs.get(job_id)
        if spec is None:
            spec_json = await self._store.job_spec_json(job_id)
            if spec_json is None:
                raise NotFound(f"job {job_id!r} not found")
            spec = self._specs[job_id] = job_spec_from_json(spec_json)
            if len(self._specs) > MAX_CACHED_SPECS:
                del self._specs[next(iter(self._specs))]
        return spec

    async def authenticate(self, api_key: str) -> ep.EpisodeState:
        """The episode of a key.

        Raises:
            Unauthenticated: No key, an unknown one, or one whose episode expired/closed.
        """
        digest = key_digest(api_key) if api_key else ""
        return await self._state(await self._episode_of(digest), digest)

    async def _episode_of(self, digest: str) -> str:
        """The episode the key of ``digest`` names (whether it is still open: ``_state``)."""
        episode_id = self._episode_ids.get(digest)
        if episode_id is None and digest:
            episode_id = await self._store.episode_of_key(digest)
            if episode_id:
                self._episode_ids[digest] = episode_id
                if len(self._episode_ids) > MAX_CACHED_KEYS:
                    del self._episode_ids[next(iter(self._episode_ids))]
        if not episode_id:
            raise Unauthenticated("unknown or expired episode API key")
        return episode_id

    async def _state(self, episode_id: str, digest: str) -> ep.EpisodeState:
        """The open episode's state, if the key of ``digest`` is still its key."""
        state = await self._store.load(episode_id)
        if state is None or state.is_closed or state.key_sha256 != digest:
            raise Unauthenticated("unknown or expired episode API key")
        return state

    async def complete(self, api_key: str, body: object,
                       is_disconnected: Callable[[], Awaitable[bool]]
                       ) -> tuple[ChatRequest, ep.EpisodeState, AsyncIterator[ep.EpisodeReply]]:
        """One chat completion of an episode: its replies, in order. Without ``stream``
        (or from a rollout that cannot stream) that is the final reply alone; with it,
        the turn's text pieces (``is_delta``) as they are sampled, then the final reply
        carrying what the pieces did not (the content's rest, the tool calls). Errors are
        raised before the first reply.

        Raises:
            Unauthenticated, InvalidArgument, ModelNotFound: See the module and
                episode_core.parse_request; ``ContextTooLong`` when the rollout refuses
                the conversation.
            ClientGone: The caller disconnected first (the call is aborted).
            FailedPrecondition: Another call of the episode is in flight (409: the
                ``openai`` client retries it after a backoff).
            DeadlineExceeded: No reply within ``REPLY_DEADLINE_MIN_S`` (or the idle
                timeout); the call is aborted as for a gone client.
        """
        digest = key_digest(api_key) if api_key else ""
        episode_id = await self._episode_of(digest)
        if episode_id in self._busy:
            raise FailedPrecondition("a call of this episode is in flight: one at a time")
        self._busy.add(episode_id)
        streaming = False
        try:
            # Read once the episode is ours: as the previous call left it.
            state = await self._state(episode_id, digest)
            algorithm = (await self._spec(state.job_id)).algorithm
            request = parse_request(body, state.model, algorithm.temperature, algorithm.top_p)
            call = plan_call(state, request)
            await self._store.push_call(state, call)
            first, call = await self._first_reply(state, request, call, is_disconnected)
            if not first.is_delta:
                state = after_call(state, request, call, first)
                await self._store.save(state)
                return request, state, _one(first)
            streaming = True
            return request, state, self._stream(state, request, call, first, is_disconnected)
        finally:
            if not streaming:  # a stream frees the episode when it ends
                self._busy.discard(episode_id)

    async def _first_reply(self, state: ep.EpisodeState, request: ChatRequest,
                           call: ep.EpisodeCall, is_disconnected: Callable[[], Awaitable[bool]]
                           ) -> tuple[ep.EpisodeReply, ep.EpisodeCall]:
        """The call's first reply, and the call as last sent (a ``RESYNC`` answer sends
        it again whole: the rollout holding the episode was re-placed from an older
        state of it, so only the whole conversation renders the right prompt)."""
        try:
            reply = await self._wait_reply(state, call, is_disconnected)
            if reply.error_code == ep.RESYNC:
                call = whole_call(request, call.call_index, is_split=False)
                await self._store.push_call(state, call)
                await self._store.count(state.job_id, "episode_resyncs")
                logger.info("[episode] call sent again whole episode_id=%s call_index=%d",
                            state.episode_id, call.call_index)
                reply = await self._wait_reply(state, call, is_disconnected)
        except (ClientGone, DeadlineExceeded):
            # Either way the caller gets no reply: abort the call, so a retry is a new
            # call and not the same messages appended twice.
            await self._abort(state, request, call)
            raise
        if reply.error_code:
            await self._store.save(after_call(state, request, call, None))
            raise reply_error(reply)
        return reply, call

    async def _stream(self, state: ep.EpisodeState, request: ChatRequest, call: ep.EpisodeCall,
                      reply: ep.EpisodeReply, is_disconnected: Callable[[], Awaitable[bool]]
                      ) -> AsyncIterator[ep.EpisodeReply]:
        """The pieces, then the final reply with the content's rest. The conversation
        records the content as the program assembled it from the pieces, so its next
        call extends it. A stream left early (client gone, deadline) aborts the call."""
        shown, done = "", False
        try:
            while reply.is_delta:
                shown += reply.content
                yield reply
                reply = await self._wait_reply(state, call, is_disconnected)
            rest = reply.content[len(shown):] if reply.content.startswith(shown) else ""
            await self._store.save(after_call(state, request, call,
                                              replace(reply, content=shown + rest)))
            done = True
            yield replace(reply, content=rest)
        finally:
            if done:
                self._busy.discard(state.episode_id)
            else:
                # Not awaited here: a cancelled response must not be cancelled again
                # mid-cleanup. The task frees the episode once the abort is queued, so a
                # next call always comes after it.
                task = asyncio.ensure_future(self._abort(state, request, call))
                self._cleanups.add(task)
                task.add_done_callback(self._cleanups.discard)

    async def _abort(self, state: ep.EpisodeState, request: ChatRequest,
                     call: ep.EpisodeCall) -> None:
        try:
            await self._store.push_call(state, ep.EpisodeCall(ep.ABORT, call.call_index))
            await self._store.save(after_call(state, request, call, None))
            await self._store.count(state.job_id, "episode_calls_aborted")
        finally:
            self._busy.discard(state.episode_id)

    async def _wait_reply(self, state: ep.EpisodeState, call: ep.EpisodeCall,
                          is_disconnected: Callable[[], Awaitable[bool]]) -> ep.EpisodeReply:
        wait_s = max(REPLY_DEADLINE_MIN_S, state.idle_timeout_s)
        deadline_s = self._clock.now_s() + wait_s
        while self._clock.now_s() < deadline_s:
            raise_if_cancelled()  # a cancel redis-py swallowed (libra/cancellation.py)
            reply = await self._store.pop_reply(state.episode_id, DISCONNECT_POLL_S)
            if reply is not None and _answers(call, reply):
                return reply
            # An older call's reply (its client went away): never shown to this one.
            if reply is None and await is_disconnected():
                raise ClientGone(state.episode_id)
        raise DeadlineExceeded(f"no reply from the rollout within {wait_s:g} s")

    async def close(self, episode_id: str, api_key: str, reward: float | None) -> None:
        """End the episode: with the program's reward, or (None) scored by the job's
        reward on the last reply. The key expires at once.

        Raises:
            Unauthenticated: Unknown or expired key.
            NotFound: The key belongs to another episode.
        """
        state = await self.authenticate(api_key)
        if state.episode_id != episode_id:
            raise NotFound(f"episode {episode_id!r} not found")
        await self._store.push_call(state, ep.EpisodeCall(
            ep.CLOSE, state.num_calls + 1, has_reward=reward is not None,
            reward=0.0 if reward is None else float(reward)))
        await self._store.forget(state)
        self._episode_ids.pop(state.key_sha256, None)
        logger.info("[episode] closed episode_id=%s reward=%s", episode_id, reward)


def _answers(call: ep.EpisodeCall, reply: ep.EpisodeReply) -> bool:
    """True if ``reply`` answers ``call``: it echoes its index, or it has index 0 (sampled
    on an instance the episode moved to after the call arrived) and its prompt extends
    the tokens the call extends. A copy of the trajectory placed again from an older
    state samples a turn before any call comes: its reply's prompt is shorter, and no
    program sees that reply."""
    if reply.call_index == call.call_index:
        return True
    return reply.call_index == 0 and (call.is_whole
                                      or reply.prompt_tokens > call.num_context_tokens)


async def _one(reply: ep.EpisodeReply) -> AsyncIterator[ep.EpisodeReply]:
    yield reply
