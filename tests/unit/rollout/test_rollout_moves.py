"""RolloutCore: placement decisions at tool returns and handoffs to other instances."""

from __future__ import annotations

import asyncio

from libra import redis_keys as keys
from libra import types as t
from libra.jobspec import TaskSpec
from tests.fakes.engine import BlockUntilAbort, make_tokenizer
from tests.unit.rollout.rig import HERE, JOB, THERE, Rig, make_task
from tests.waiting import wait_until

# -- placement decisions -------------------------------------------------------------------

async def handed_over(rig: Rig) -> tuple[t.Trajectory, str]:
    """The one trajectory handed to THERE (once it is in its inbox), with its job id."""
    await wait_until(lambda: rig.inbox_size(THERE))
    ((job_id, moved),) = await rig.world.inbox_tasks(THERE)
    return moved, job_id

async def test_move_decision_hands_the_trajectory_to_the_target_inbox_intact(rig: Rig) -> None:
    tok = make_tokenizer()
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    moved, job_id = await handed_over(rig)
    prompt, calc, res = (tok.encode_prompt("Q:1+2="), tok.encode("<calc>1+2</calc>"),
                         tok.encode("<res>3</res>"))
    assert moved.token_ids == prompt + calc + res
    assert moved.loss_mask == [0] * len(prompt) + [1] * len(calc) + [0] * len(res)
    assert moved.logprobs == [0.0] * len(prompt) + [-0.5] * len(calc) + [0.0] * len(res)
    assert moved.token_versions == [-1] * len(prompt) + [0] * len(calc) + [-1] * len(res)
    assert (moved.num_migrations, moved.num_turns, job_id) == (1, 1, JOB)


async def test_move_decision_acks_the_entry_here_and_frees_the_slot(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.inbox_size(THERE))
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.inbox_pending() == 0 and await rig.inbox_size() == 0
    assert await rig.num_published() == 0
    assert await rig.world.task(JOB, "tr-0") is not None


async def test_move_to_this_instance_keeps_the_trajectory_here(rig: Rig) -> None:
    rig.scheduler.move_to(HERE)
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.num_migrations == 0 and await rig.inbox_size(THERE) == 0


async def test_handed_over_trajectory_continues_from_its_tokens(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    moved, _ = await handed_over(rig)
    # Back on this instance (e.g. re-placed): the agent keeps its tokens, one more turn.
    rig.engine.queue("<ans>3</ans>")
    await rig.place(moved)
    (traj,) = await rig.run_until_published()
    assert traj.token_ids[:len(moved.token_ids)] == moved.token_ids
    assert traj.num_turns == 2 and rig.engine.requests[-1].prompt_token_ids == moved.token_ids


async def test_move_decided_during_the_next_engine_call_stops_just_that_row(
        rig: Rig) -> None:
    """The decision of tool return 1 comes while the trajectory samples turn 2: its row
    is stopped at a token boundary and it leaves with the partial turn (the call itself
    is not aborted)."""
    tok = make_tokenizer()
    rig.scheduler.gate = asyncio.Event()
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>", BlockUntilAbort("<calc>2+3</calc>", keep=3))
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: len(rig.engine.requests) == 2)  # blocked in turn 2
    rig.scheduler.gate.set()
    moved, _ = await handed_over(rig)
    calc1, res, part = (tok.encode("<calc>1+2</calc>"), tok.encode("<res>3</res>"),
                        tok.encode("<calc>2+3</calc>")[:3])
    assert moved.token_ids == tok.encode_prompt("Q:1+2=") + calc1 + res + part
    assert moved.loss_mask[-3:] == [1, 1, 1] and moved.check_aligned() is None
    assert (moved.partial_turn_tokens, moved.num_turns, moved.num_migrations) == (3, 1, 1)
    assert rig.engine.aborted_rows == [0] and rig.engine.num_aborts == 0
    assert (rig.core.num_moves_mid_turn, rig.core.num_moves_handed_off) == (1, 1)
    assert await rig.load() == {HERE: 0, THERE: 1}


async def test_handed_over_partial_turn_is_resumed_and_parsed_whole(rig: Rig) -> None:
    tok = make_tokenizer()
    arrived = make_task()
    part = tok.encode("<calc>2+3</calc>")[:3]
    prompt = tok.encode_prompt(arrived.prompt_text)
    arrived.token_ids, arrived.num_prompt_tokens = prompt + part, len(prompt)
    arrived.loss_mask = [0] * len(prompt) + [1] * 3
    arrived.logprobs = [0.0] * len(prompt) + [-0.5] * 3
    arrived.token_versions = [-1] * len(prompt) + [0] * 3
    arrived.partial_turn_tokens = 3
    rig.engine.queue(tok.decode(tok.encode("<calc>2+3</calc>")[3:]), "<ans>5</ans>")
    await rig.place(arrived)
    (traj,) = await rig.run_until_published()
    first = rig.engine.requests[0]
    assert first.prompt_token_ids == prompt + part
    assert first.max_new_tokens == TaskSpec().max_new_tokens_per_turn - 3
    assert rig.tools.calls[0]["args"] == {"expression": "2+3"}
    assert (traj.num_turns, traj.partial_turn_tokens) == (2, 0)


async def test_handoff_commits_the_move_in_assignment_load_and_counters(rig: Rig) -> None:
    rig.scheduler.move_to(THERE, bucket="long")
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.inbox_size(THERE))
    assert await rig.world.assignment(JOB, "tr-0") == THERE
    assert await rig.load() == {HERE: 0, THERE: 1}
    assert await rig.counters() == {"migrations": 1, keys.placed_counter("long"): 1}
    assert rig.core.num_moves_handed_off == 1


async def test_tool_return_does_not_wait_for_the_decision(rig: Rig) -> None:
    rig.scheduler.gate = asyncio.Event()  # the scheduler has not answered yet
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.num_turns == 2 and len(rig.scheduler.tool_returns) == 1
    assert rig.scheduler.num_answered == 0


async def test_move_decided_after_the_trajectory_finished_is_moot(rig: Rig) -> None:
    rig.scheduler.gate = asyncio.Event()
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    rig.scheduler.gate.set()
    await wait_until(lambda: rig.core.num_moves_moot == 1)
    assert await rig.inbox_size(THERE) == 0
    # Never committed: the assignment and load still say where it ran.
    assert await rig.world.assignment(JOB, "tr-0") == HERE
    assert await rig.load() == {HERE: 1}
    assert await rig.counters() == {"produced": 1}


def release_first_decision_at_second_tool_call(rig: Rig) -> None:
    """Hold the scheduler's answers until the trajectory is in its second tool call."""

    async def release() -> None:
        if len(rig.tools.calls) == 2:
            rig.scheduler.gate.set()
            await wait_until(lambda: rig.scheduler.num_answered == 1)

    rig.tools.on_execute = release


async def test_move_decided_during_the_next_turn_hands_off_at_its_tool_return(
        rig: Rig) -> None:
    """The decision of tool return 1 comes while the trajectory is in its tool call 2:
    it leaves after tool return 2, whose own decision (a STAY pinned there) is awaited."""
    tok = make_tokenizer()
    rig.scheduler.gate = asyncio.Event()
    rig.scheduler.move_to(THERE)
    rig.scheduler.stay_at(THERE)
    release_first_decision_at_second_tool_call(rig)
    rig.engine.queue("<calc>1+2</calc>", "<calc>2+3</calc>")
    await rig.place(make_task())
    rig.start()
    moved, _ = await handed_over(rig)
    calc1, calc2, res = (tok.encode("<calc>1+2</calc>"), tok.encode("<calc>2+3</calc>"),
                         tok.encode("<res>3</res>"))
    assert moved.token_ids == tok.encode_prompt("Q:1+2=") + calc1 + res + calc2 + res
    assert (moved.num_turns, moved.num_migrations, len(rig.scheduler.tool_returns)) == (2, 1, 2)
    assert await rig.load() == {HERE: 0, THERE: 1}
    # Only the awaited decision (a move was pending) needs its stay answered.
    assert [report["needs_answer"] for report in rig.scheduler.tool_returns] == [False, True]


async def test_move_back_here_cancels_a_pending_move(rig: Rig) -> None:
    rig.scheduler.gate = asyncio.Event()
    rig.scheduler.move_to(THERE)
    rig.scheduler.move_to(HERE)
    release_first_decision_at_second_tool_call(rig)
    rig.engine.queue("<calc>1+2</calc>", "<calc>2+3</calc>", "<ans>5</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert (traj.num_turns, traj.num_migrations) == (3, 0)
    assert await rig.inbox_size(THERE) == 0


async def test_handoff_of_a_trajectory_no_longer_assigned_here_is_refused(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task(), assign=False)  # re-queued by the scheduler meanwhile
    rig.start()
    await wait_until(lambda: rig.scheduler.num_answered == 1)
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.inbox_size(THERE) == 0 and await rig.num_published() == 0
    assert rig.core.num_moves_handed_off == 0
    assert await rig.counters() == {}


async def test_handoff_from_a_stale_lease_epoch_is_refused(rig: Rig) -> None:
    rig.scheduler.move_to(THERE)
    rig.engine.queue("<calc>1+2</calc>")
    await rig.world.set_lease_epoch(HERE, rig.coordinator.epoch + 1)
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.scheduler.num_answered == 1)
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.inbox_size(THERE) == 0
    assert await rig.world.assignment(JOB, "tr-0") == HERE
