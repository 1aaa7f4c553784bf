"""The ``external`` agent: an agent program outside Libra drives the trajectory through
the OpenAI-compatible endpoint (pure; the Redis side is an :class:`EpisodeChannel`).

The trajectory is an episode (libra/episodes.py). Nothing about the batched loop
changes; only what a "tool call" is:

- a fresh trajectory starts by offering itself to agent programs and waiting for the
  episode's first call (the rollout core runs that wait like a tool call, see
  ``awaits_first_call``); the call's messages and tools, rendered by the model's chat
  template, are the prompt (mask 0);
- every sampled turn goes out as the call's reply, and the program's next call is the
  turn's "tool return": its new messages (tool results, user follow-ups) are appended
  exactly as the template renders them after a closed assistant turn (mask 0, version
  -1); the sampled tokens keep their log-probs and versions. The scheduler decides at
  each of these returns as for any tool (tool type: the tool message's name);
- a call whose messages do not extend the previous call's conversation (the endpoint
  compares message by message: the program rewrote history) starts a new sequence from
  the full render; the sequence so far is kept in ``traj.segments`` and trained as its
  own sequence with the episode's group and reward (counted: ``episode_splits``);
- the close (``POST /v1/episodes/{id}/reward``) ends the trajectory with the given
  reward, or, without one, scores the last reply with the job's reward;
- no call within ``task.episode_idle_timeout_s``: the trajectory fails ("episode timed
  out"), the trainer drops it, and it is counted (``episodes_timed_out``);
- an aborted call (its client went away): the sampled turn is taken back out of the
  trajectory (never trained on, never seen by another episode) and the episode waits
  for the program's next call;
- one program per episode: an episode is offered once per id (a marker in Redis that
  lives as long as the episode). A trajectory placed again (its instance lost its
  lease, restarted, or its job resumed) is not offered again: it waits for the same
  program's calls. It holds an older state than the program's conversation, so it
  answers the next call that extends tokens it does not hold with ``RESYNC`` and the
  endpoint sends that call again whole (counted: ``episode_resyncs``). The instance
  that dropped it stops waiting (``drop``) and gives back a call it took meanwhile.

State that must survive a move lives in the trajectory; the rest (the reply being
assembled, what a call asked for) lives here only between a turn and its tool return,
which happen on the same instance.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Coroutine, Sequence
from typing import Any

from libra import episodes as ep
from libra import types as t
from libra.chat.protocol import ChatFormat
from libra.jobspec import JobSpec
from services.rollout.agent import (
    ChatAgent,
    ToolTurnResult,
    TurnOutcome,
    append_context,
    apply_partial,
)
from services.rollout.engine_types import GenerationRequest, GenerationResult
from services.rollout.episode_stream import (
    EngineCallWatch,
    RowAborter,
    TurnStream,
    cut_at_stop,
)
from services.rollout.episode_turn import (
    AGENT_REWARD,
    EPISODE_CLOSE,
    EPISODE_START,
    REPLY,
    EpisodeChannel,
    EpisodeEnded,
    EpisodeLeft,
    EpisodeTurn,
    PendingCall,
    keep_as_segment,
    needs_resync,
    tool_result,
    tool_type,
)

__all__ = ["EpisodeChannel", "EpisodeEnded", "EpisodeLeft", "ExternalAgent"]

logger = logging.getLogger(__name__)


class ExternalAgent(ChatAgent):
    """The agent loop of an episode (``channel``: its Redis side, set by ``attach``).

    A chat agent whose prompt and tool turns come from the program's calls (the
    template, parser, turn text and transcript are the chat agent's)."""

    awaits_first_call = True

    def __init__(self, spec: JobSpec, tokenizer: Any, chat: ChatFormat) -> None:
        super().__init__(spec, tokenizer, chat)
        self._channel: EpisodeChannel | None = None
        self._turns: dict[str, EpisodeTurn] = {}
        self._formats: dict[str, ChatFormat] = {}

    def attach(self, channel: EpisodeChannel) -> None:
        """The rollout's episode channel (Redis), given once the agent is built."""
        self._channel = channel

    # -- the Agent contract ------------------------------------------------------------

    def start(self, traj: t.Trajectory) -> None:
        """Nothing to render yet: the program's first call brings the prompt."""

    def next_request(self, traj: t.Trajectory, seed: int | None,
                     num_turn_tokens: int = 0) -> GenerationRequest | None:
        """The next turn, or None once the program closed the episode."""
        if traj.status is t.TrajectoryStatus.FINISHED:  # closed (see apply_tool_results)
            return None
        request = super().next_request(traj, seed, num_turn_tokens)
        state = self._turn(traj)
        if request is None or not (state.max_tokens or state.stop or state.seed is not None):
            return request
        # What the call asked for (only where it answers: a move loses it, see EpisodeTurn).
        max_new = request.max_new_tokens
        if state.max_tokens:
            max_new = min(max_new, max(state.max_tokens - num_turn_tokens, 1))
        return dataclasses.replace(
            request, max_new_tokens=max_new, stop_strings=[*request.stop_strings, *state.stop],
            seed=request.seed if state.seed is None else state.seed)

    def apply_generation(self, traj: t.Trajectory, result: GenerationResult,
                         turn_prefix: Sequence[int] = ()) -> TurnOutcome:
        """Append the sampled turn (mask 1) and keep its reply for the program."""
        state = self._turn(traj)
        state.turn_start = len(traj.token_ids) - len(turn_prefix)
        apply_partial(traj, result)
        traj.num_turns += 1
        ids = list(turn_prefix) + result.token_ids
        # The program reads the turn up to the call's stop string, as OpenAI returns it;
        # the sampled tokens (through the stop) are what trains.
        text = cut_at_stop(self._turn_text(ids), state.stop)
        parsed = self._parser.parse(text)
        calls = tuple(ep.ToolCallOut(f"call_{traj.trajectory_id[-8:]}_{traj.num_turns}_{i}",
                                     c.name, json.dumps(c.arguments))
                      for i, c in enumerate(parsed.calls))
        # A malformed call is the model's words: the program reads them as content.
        content = parsed.content if not parsed.errors else text.strip()
        reason = ("tool_calls" if calls else "length" if result.finish_reason == "length"
                  else "stop")
        state.reply = ep.EpisodeReply(
            call_index=state.call_index, content=content, tool_calls=calls,
            finish_reason=reason, prompt_tokens=state.turn_start, completion_tokens=len(ids),
            policy_version=result.policy_version)
        return TurnOutcome(errors=[REPLY])

    def apply_tool_results(self, traj: t.Trajectory,
                           results: Sequence[ToolTurnResult]) -> None:
        """Apply what the program's call asked for (prompt, new messages, or close)."""
        pending = self._turn(traj).pending
        self._turn(traj).pending = None
        if pending is None:
            return
        if pending.close is not None:
            self._close(traj, pending.close)
            return
        if pending.is_whole:  # the first call, a rewritten history, a retried first call
            self._turn(traj).call_start = None
            keep_as_segment(traj)
            self._start_with(traj, pending.ids)
            traj.tool_states.clear()
            traj.tool_return_positions.clear()
            return
        self._turn(traj).call_start = (len(traj.token_ids), len(traj.tool_states))
        append_context(traj, pending.ids)
        for item in results:
            traj.tool_states.append(item.result.state)
            traj.tool_return_positions.append(traj.num_generated_tokens)

    def final_answer(self, traj: t.Trajectory) -> str | None:
        """What the job's reward scores after a close without a reward (None: the
        program gave the reward, or the episode ended otherwise)."""
        if AGENT_REWARD in traj.reward_components or not traj.final_text:
            return None
        return traj.final_text

    # -- while an engine call samples: streamed text out, gone clients' rows stopped ------

    def client_gone(self, traj: t.Trajectory) -> bool:
        """True when the turn being sampled answers a call whose client went away (its
        engine row was stopped: the turn is not resumed but taken back)."""
        return self._turn(traj).client_gone

    def during_engine_call(self, engine: RowAborter, batch: Sequence[t.Trajectory],
                           poll_s: float) -> Coroutine[Any, Any, None]:
        """The watch of one engine call over ``batch`` (row i: ``batch[i]``), to run
        until the call ends (episode_stream.py). Called before the call starts: the
        engine gets its token sink now."""
        assert self._channel is not None, "attach() the episode channel first"
        episodes = [traj.trajectory_id for traj in batch]
        turns = [self._turns.get(episode_id) for episode_id in episodes]
        watch = EngineCallWatch(
            self._channel, engine, episodes,
            streams={row: turn.stream for row, turn in enumerate(turns)
                     if turn is not None and turn.stream is not None},
            call_indices={e: turn.call_index for e, turn in zip(episodes, turns, strict=True)
                          if turn is not None},
            decode=self._turn_text, on_gone=self._mark_gone,
            ttl_s=self._spec.task.episode_idle_timeout_s)
        watch.start()
        return watch.run(poll_s)

    def _mark_gone(self, episode_id: str) -> None:
        if episode_id in self._turns:
            self._turns[episode_id].client_gone = True

    # -- the "tool call": hand the turn to the program, wait for its next call ------------

    async def run_turn(self, spec: JobSpec, traj: t.Trajectory,
                       outcome: TurnOutcome) -> list[ToolTurnResult]:
        """Send the turn's reply (or, first, the offer) and wait for the next call.

        Raises:
            EpisodeEnded: No call within ``task.episode_idle_timeout_s``.
            EpisodeLeft: This instance dropped the trajectory meanwhile (``drop``).
        """
        assert self._channel is not None, "attach() the episode channel first"
        state = self._turn(traj)
        timeout_s = spec.task.episode_idle_timeout_s
        if not traj.token_ids:
            await self._offer_once(traj, timeout_s)
        elif state.reply is not None and not state.client_gone:
            await self._channel.reply(traj.trajectory_id, state.reply, timeout_s)
        while True:
            call = await self._channel.next_call(traj.trajectory_id, timeout_s,
                                                 lambda: state.has_left)
            if state.has_left:
                raise await self._leave(traj, call, timeout_s)
            if call is None:
                await self._channel.count(traj.job_id, "episodes_timed_out")
                self._forget(traj.trajectory_id, state)
                raise EpisodeEnded(f"episode timed out: no call within "
                                   f"task.episode_idle_timeout_s = {timeout_s:g} s")
            results = await self._take(spec, traj, state, call)
            if results is not None and state.has_left:  # dropped while it was taken
                raise await self._leave(traj, call, timeout_s)
            if results is not None:
                return results

    def drop(self, episode_ids: Sequence[str]) -> None:
        """This instance no longer holds these episodes' trajectories (lease lost, job
        ended): their waits end (within one blocking read), a call taken meanwhile goes
        back, and a copy placed here again starts from fresh state."""
        for episode_id in episode_ids:
            state = self._turns.pop(episode_id, None)
            if state is not None:
                state.has_left = True

    async def _offer_once(self, traj: t.Trajectory, timeout_s: float) -> None:
        assert self._channel is not None
        if not await self._channel.offer(self._offer(traj), timeout_s):
            # Placed again (lease lapse, restart, resumed job): its program is still
            # the one that opened it; its next call comes here.
            await self._channel.count(traj.job_id, "episodes_placed_again")
            logger.info("[episode] offered before; waiting for its program's calls "
                        "episode_id=%s", traj.trajectory_id)

    async def _leave(self, traj: t.Trajectory, call: ep.EpisodeCall | None,
                     timeout_s: float) -> EpisodeLeft:
        assert self._channel is not None
        if call is not None:  # the holder now takes it, in order (it was the head)
            await self._channel.give_back(traj.trajectory_id, call, timeout_s)
        logger.info("[episode] dropped here; its calls go to its new holder episode_id=%s",
                    traj.trajectory_id)
        return EpisodeLeft(f"episode {traj.trajectory_id} left this instance")

    def _forget(self, episode_id: str, state: EpisodeTurn) -> None:
        if self._turns.get(episode_id) is state:  # not a copy placed here again
            del self._turns[episode_id]

    async def _take(self, spec: JobSpec, traj: t.Trajectory, state: EpisodeTurn,
                    call: ep.EpisodeCall) -> list[ToolTurnResult] | None:
        """Apply one call; None: keep waiting (an aborted call, a refused one)."""
        if call.kind == ep.ABORT:
            self._take_back(traj, state, call)
            return None
        if call.kind == ep.CLOSE:
            state.pending = PendingCall(close=call)
            return [tool_result(EPISODE_CLOSE, 0)]
        if needs_resync(traj, call):
            await self._refuse(traj, call, ep.RESYNC, (
                f"this rollout holds {len(traj.token_ids)} tokens of the episode, the call "
                f"extends {call.num_context_tokens}: send the whole conversation"))
            return None
        if traj.num_turns >= spec.task.max_turns:
            await self._refuse(traj, call, ep.INVALID_REQUEST, (
                f"the episode used its task.max_turns = {spec.task.max_turns} turns: close "
                "it (POST /v1/episodes/{id}/reward)"))
            return None
        try:
            pending, messages = self._render(traj, call)
        except ValueError as exc:
            await self._refuse(traj, call, ep.INVALID_REQUEST, str(exc))
            return None
        room = self.max_context_tokens - (0 if pending.is_whole else len(traj.token_ids))
        if len(pending.ids) >= room:
            await self._refuse(traj, call, ep.CONTEXT_LENGTH_EXCEEDED, (
                f"this conversation needs more than the model's maximum context length "
                f"(max_context_tokens = {self.max_context_tokens}; the prompt would take "
                f"{self.max_context_tokens - room + len(pending.ids)} tokens)"))
            return None
        if pending.is_split:
            await self._channel.count(traj.job_id, "episode_splits")  # type: ignore[union-attr]
        state.pending, state.max_tokens = pending, call.max_tokens
        state.stop, state.seed = call.stop, call.seed
        state.stream = TurnStream(call.call_index, call.stop) if call.stream else None
        state.call_index = call.call_index
        if pending.is_whole:
            return [tool_result(EPISODE_START, len(pending.ids))]
        return [tool_result(tool_type(m), len(pending.ids)) for m in messages]

    def _render(self, traj: t.Trajectory,
                call: ep.EpisodeCall) -> tuple[PendingCall, list[dict[str, Any]]]:
        messages = json.loads(call.messages_json)
        chat = self._format(call.tools_json)
        if call.is_whole:  # (an extension of tokens not held here: see needs_resync)
            return PendingCall(ids=chat.prompt_ids(messages), is_whole=True,
                               is_split=call.is_split), messages
        closed = traj.token_ids[-1] in chat.stop_token_ids
        return PendingCall(ids=chat.tool_turn_ids(messages, turn_closed=closed)), messages

    def _take_back(self, traj: t.Trajectory, state: EpisodeTurn, call: ep.EpisodeCall) -> None:
        """Remove the last call's messages and its sampled turn (its client went away
        before reading the reply; the program sends the call again or another one)."""
        known = state.reply is not None and state.reply.call_index != 0
        if state.reply is None or (known and call.call_index != state.reply.call_index):
            return
        cut, num_states = state.call_start or (state.turn_start, len(traj.tool_states))
        for name in ("token_ids", "loss_mask", "logprobs", "token_versions"):
            del getattr(traj, name)[cut:]
        del traj.tool_states[num_states:]
        del traj.tool_return_positions[num_states:]
        state.call_start = None
        traj.num_turns -= 1
        state.reply, state.client_gone = None, False
        logger.info("[episode] call aborted by its client; turn discarded episode_id=%s",
                    traj.trajectory_id)

    async def _refuse(self, traj: t.Trajectory, call: ep.EpisodeCall, code: str,
                      message: str) -> None:
        assert self._channel is not None
        await self._channel.reply(traj.trajectory_id, ep.EpisodeReply(
            call_index=call.call_index, error_code=code, error_message=message),
            self._spec.task.episode_idle_timeout_s)

    def _close(self, traj: t.Trajectory, call: ep.EpisodeCall) -> None:
        """Mark the trajectory closed (its next_request is then None, on any instance)."""
        state = self._turns.pop(traj.trajectory_id, EpisodeTurn())
        traj.status = t.TrajectoryStatus.FINISHED
        traj.final_text = state.reply.content if state.reply is not None else ""
        if call.has_reward:
            traj.reward = call.reward
            traj.reward_components = {AGENT_REWARD: call.reward}

    # -- helpers ------------------------------------------------------------------------

    def _turn(self, traj: t.Trajectory) -> EpisodeTurn:
        return self._turns.setdefault(traj.trajectory_id, EpisodeTurn())

    def _format(self, tools_json: str) -> ChatFormat:
        """The model's template with the call's tools (one per tool set: building one
        probes the template)."""
        chat = self._formats.get(tools_json)
        if chat is None:
            base = self._chat
            chat = ChatFormat(base.tokenizer, tools=json.loads(tools_json),
                              tool_template=self._spec.model.tool_template,
                              system_prompt="", parser=base.parser)
            self._formats[tools_json] = chat
        return chat

    def _offer(self, traj: t.Trajectory) -> ep.EpisodeOffer:
        return ep.EpisodeOffer(
            episode_id=traj.trajectory_id, job_id=traj.job_id, prompt_id=traj.prompt_id,
            group_id=traj.group_id, prompt_text=traj.prompt_text,
            prompt_messages_json=traj.prompt_messages_json, metadata_json=traj.metadata_json,
            max_context_tokens=self.max_context_tokens)

