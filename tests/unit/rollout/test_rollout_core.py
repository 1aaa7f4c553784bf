"""RolloutCore's busy loop: answers, tool turns, publishing, fencing, cancel and lease loss
(the rig: rig.py). The core runs as a task; tests wait for the observable result (a
stream entry, a counter) with a bounded poll."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from libra import types as t
from libra.errors import Internal, Unavailable
from libra.jobspec import JobSpec, LayoutSpec
from libra.types import Bucket
from services.rollout import lease_keeper
from tests.fakes.engine import make_tokenizer
from tests.fakes.toolgateway import tool_result
from tests.unit.rollout.rig import HERE, JOB, THERE, Rig, make_task
from tests.waiting import DEFAULT_TIMEOUT_S, wait_until

# -- answer in one turn --------------------------------------------------------------------

async def test_answer_in_one_turn_is_published_with_the_gateway_reward(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    rig.tools.reward = 0.75
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert (traj.trajectory_id, traj.status, traj.reward, traj.final_text) == (
        "tr-0", t.TrajectoryStatus.FINISHED, 0.75, "3")
    assert rig.tools.scores[0]["reference"] == "3"


async def test_published_trajectory_is_aligned_and_stamped_with_this_instance(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.check_aligned() is None
    assert (traj.instance_id, traj.bucket, traj.num_turns) == (HERE, "short", 1)
    assert traj.finished_at_ms == rig.clock.now_ms()


async def test_published_trajectory_inbox_entry_is_acked_and_deleted(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert await rig.inbox_size() == 0
    assert await rig.inbox_pending() == 0


async def test_published_trajectory_counts_produced(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert await rig.counters() == {"produced": 1}


async def test_published_eval_trajectory_counts_apart_with_its_round(rig: Rig) -> None:
    """Held-out eval: its own counter (outside the training identity), the tag kept."""
    rig.engine.queue("<ans>3</ans>")
    task = make_task()
    task.eval_round = 2
    await rig.place(task)
    (traj,) = await rig.run_until_published()
    assert traj.eval_round == 2
    assert await rig.counters() == {"eval_produced": 1}


async def test_published_entry_carries_what_the_scheduler_reads_to_free_the_slot(
        rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    (entry,) = await rig.published_entries()
    assert (entry.trajectory.trajectory_id, entry.total_tokens, entry.status,
            entry.instance_id) == ("tr-0", traj.num_generated_tokens, "finished", HERE)


async def test_result_of_an_instance_whose_lease_moved_on_is_not_published(
        rig: Rig) -> None:
    rig.tools.gate = asyncio.Event()
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)
    # A newer grant of this instance's lease (this process is now a zombie).
    await rig.world.set_lease_epoch(HERE, rig.coordinator.epoch + 1)
    rig.tools.gate.set()
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.num_published() == 0
    assert await rig.counters() == {}
    assert await rig.inbox_pending() == 1  # not acknowledged either: it stays re-placeable


async def test_result_of_an_instance_whose_lease_expired_is_not_published(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>")
    await rig.world.delete_lease(HERE)
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.engine.requests)
    await wait_until(lambda: rig.core.num_active == 0)
    assert await rig.num_published() == 0


async def test_tool_return_reports_carry_the_lease_epoch(rig: Rig) -> None:
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    (report,) = rig.scheduler.tool_returns
    assert report["lease_epoch"] == rig.coordinator.epoch == 1


async def test_ready_trajectories_share_one_engine_call(rig: Rig) -> None:
    rig.engine.queue("<ans>3</ans>", "<ans>4</ans>")
    await rig.place(make_task(0))
    await rig.place(make_task(1))
    await rig.run_until_published(2)
    assert rig.engine.batch_sizes == [2]


async def test_task_of_an_unknown_job_is_acked_and_dropped(rig: Rig) -> None:
    stranger = make_task()
    stranger.job_id = t.JobId("no-such-job")
    await rig.place(stranger)
    rig.start()
    await wait_until(lambda: _inbox_empty(rig))
    assert rig.engine.requests == [] and rig.core.num_active == 0


async def _inbox_empty(rig: Rig) -> bool:
    return await rig.inbox_size() == 0 and await rig.inbox_pending() == 0


# -- tool calls ----------------------------------------------------------------------------

async def test_tool_output_is_appended_masked_and_the_next_turn_sees_it(rig: Rig) -> None:
    tok = make_tokenizer()
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    rig.tools.results.append(tool_result("3"))
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    prompt, calc, res, ans = (tok.encode_prompt("Q:1+2="), tok.encode("<calc>1+2</calc>"),
                              tok.encode("<res>3</res>"), tok.encode("<ans>3</ans>"))
    assert traj.token_ids == prompt + calc + res + ans
    assert traj.loss_mask == [0] * len(prompt) + [1] * len(calc) + [0] * len(res) + [1] * len(ans)
    assert rig.engine.requests[1].prompt_token_ids == prompt + calc + res
    assert rig.tools.calls[0]["args"] == {"expression": "1+2"}
    assert traj.num_turns == 2 and traj.tool_return_positions == [len(calc) + len(res)]


async def test_tool_return_is_reported_to_the_scheduler(rig: Rig) -> None:
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    (report,) = rig.scheduler.tool_returns
    assert (report["trajectory_id"], report["state"], report["instance_id"]) == (
        "tr-0", traj.tool_states[0], HERE)


async def test_tool_gateway_down_until_deadline_publishes_failed(rig: Rig) -> None:
    rig.tools.fail_times, rig.tools.advance_s_per_call = -1, 2.0
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.status is t.TrajectoryStatus.FAILED
    assert traj.failure_reason.startswith("tool gateway")
    assert await rig.counters() == {"failed": 1}
    assert len({c["call_id"] for c in rig.tools.calls}) == 1  # retries reuse the call id


async def test_core_keeps_serving_after_a_tool_failure(rig: Rig) -> None:
    rig.tools.fail_times, rig.tools.advance_s_per_call = -1, 2.0
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    rig.tools.fail_times = 0
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(1))
    trajs = await rig.run_until_published(2)
    assert trajs[1].status is t.TrajectoryStatus.FINISHED


async def test_tool_gateway_down_twice_is_retried_to_success(rig: Rig) -> None:
    rig.tools.fail_times, rig.tools.advance_s_per_call = 2, 0.5
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    (traj,) = await rig.run_until_published()
    assert traj.status is t.TrajectoryStatus.FINISHED
    assert len(rig.tools.calls) == 3


# -- job end and lease ---------------------------------------------------------------------

async def _cancel_while_in_tool_call(rig: Rig) -> None:
    rig.tools.gate = asyncio.Event()
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)
    await rig.world.set_job_state(JOB, "cancelled")
    await wait_until(lambda: rig.core.num_active == 0)


async def test_cancelled_job_drops_active_work_and_acks_it(rig: Rig) -> None:
    await _cancel_while_in_tool_call(rig)
    assert await rig.inbox_pending() == 0 and rig.core.job_id == ""


async def test_tool_return_after_cancel_is_neither_published_nor_handed_off(rig: Rig) -> None:
    await _cancel_while_in_tool_call(rig)
    rig.scheduler.move_to(THERE)
    rig.tools.gate.set()
    await wait_until(lambda: rig.scheduler.tool_returns)
    await wait_until(lambda: rig.core.num_tasks == 0)  # the tool task did all it would do
    assert await rig.inbox_size(THERE) == 0
    assert await rig.num_published() == 0


async def test_lost_lease_drops_work_and_registers_again(short_lease_rig: Rig) -> None:
    rig = short_lease_rig
    rig.tools.gate = asyncio.Event()
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await wait_until(lambda: rig.tools.calls)  # pinned here, in its tool call
    rig.coordinator.lose_lease_times = 1
    await wait_until(lambda: len(rig.coordinator.acquired) == 2)
    assert rig.core.num_active == 0
    rig.tools.gate.set()
    await wait_until(lambda: rig.scheduler.tool_returns)
    await wait_until(lambda: rig.core.num_tasks == 0)
    assert await rig.num_published() == 0


async def test_a_registration_refused_during_a_coordinator_restart_is_tried_again(
        short_lease_rig: Rig) -> None:
    rig = short_lease_rig
    rig.start()
    await wait_until(lambda: rig.coordinator.renewed)
    # The lease expired while the coordinator was down; it is back but the first
    # re-registration still meets the restart.
    rig.coordinator.acquire_unavailable_times = 2
    rig.coordinator.lose_lease_times = 1
    await wait_until(lambda: len(rig.coordinator.acquired) == 2)
    assert not rig.task.done()  # the heartbeat goes on
    renewed = len(rig.coordinator.renewed)
    await wait_until(lambda: len(rig.coordinator.renewed) > renewed)  # with the new lease
    assert rig.coordinator.renewed[-1] == (HERE, rig.coordinator.epoch)


async def test_at_start_a_coordinator_not_up_yet_is_waited_for(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    # Services start in any order: the first asks meet a coordinator still starting.
    monkeypatch.setattr(lease_keeper, "START_RETRY_S", 0.001)
    rig.coordinator.acquire_unavailable_times = 3
    lease = await rig.core.register(wait_s=60)
    assert lease.epoch == rig.coordinator.epoch and rig.coordinator.acquire_unavailable_times == 0


async def test_at_start_a_coordinator_that_never_answers_fails_after_the_wait(
        rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_keeper, "START_RETRY_S", 0.001)
    rig.coordinator.acquire_unavailable_times = 10**9
    with pytest.raises(Unavailable, match="coordinator restarting"):
        await rig.core.register(wait_s=0.05)
    with pytest.raises(Unavailable):  # no wait asked: the first refusal is final
        await rig.core.register()


async def test_the_lease_is_renewed_every_third_of_the_ttl_granted(rig: Rig) -> None:
    # Asked for 60 s (renewals every 20 s: none within this test); the coordinator grants
    # 30 ms (it decides: lease_renewals_per_s), so renewals come every 10 ms.
    rig.coordinator.grant_ttl_ms = 30
    assert (await rig.core.register()).ttl_ms == 30
    rig.start()
    await wait_until(lambda: len(rig.coordinator.renewed) >= 3)
    assert rig.coordinator.renewed[-1] == (HERE, rig.coordinator.epoch)


async def test_drain_releases_the_lease(rig: Rig) -> None:
    rig.start()
    await rig.core.drain(0.0)
    await asyncio.wait_for(rig.task, DEFAULT_TIMEOUT_S)
    assert rig.coordinator.released == [(HERE, 1)]


async def test_drain_ends_cleanly_when_the_coordinator_is_stopping_too(rig: Rig) -> None:
    # `libra down` stops every service at once: the release may find no coordinator.
    rig.coordinator.release_error = Internal("CANCELLED")
    rig.start()
    await rig.core.drain(0.0)
    await asyncio.wait_for(rig.task, DEFAULT_TIMEOUT_S)
    assert rig.coordinator.released == [(HERE, 1)]


async def test_engine_is_loaded_with_the_tp_degree_of_this_instances_bucket(
        rig: Rig) -> None:
    spec = JobSpec(layout=LayoutSpec(buckets=[Bucket(name="short", max_tokens=96,
                                                         tp_degree=2),
                                              Bucket(name="long", max_tokens=256,
                                                         tp_degree=4)]))
    await rig.world.put_job(JOB, spec.to_json(), "running")
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    assert rig.core._intake.loader.tp_degrees == [2]


async def test_tool_calls_carry_the_jobs_tool_settings(rig: Rig) -> None:
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    call = rig.tools.calls[0]
    assert (call["tool"], call["args"]) == ("calculator", {"expression": "1+2"})
    assert call["options"] == {"transient_failure_rate": 0.25}


# -- a prompt the agent cannot render ----------------------------------------------------

async def test_prompt_the_agent_cannot_render_fails_that_trajectory_only(rig: Rig) -> None:
    bad = make_task(0)
    bad.prompt_messages_json = '[{"role": "user", "content": "1+2?"}]'  # arith: text only
    rig.engine.queue("<ans>3</ans>")
    await rig.place(bad)
    await rig.place(make_task(1))
    published = {traj.trajectory_id: traj for traj in await rig.run_until_published(2)}
    assert published["tr-0"].status is t.TrajectoryStatus.FAILED
    assert published["tr-0"].failure_reason.startswith("prompt: the arith tag agent")
    assert published["tr-1"].status is t.TrajectoryStatus.FINISHED


async def test_settings_replaced_after_construction_reach_the_lease(rig: Rig) -> None:
    # The entry point learns the server's port only once it serves: the lease it
    # registers with must carry that address (the elastic executor dials it to lend).
    rig.core.settings = dataclasses.replace(rig.core.settings, address="10.0.0.7:5051",
                                            role=t.WorkerRole.HYBRID_ROLLOUT)
    lease = await rig.core.register()
    assert (lease.address, lease.role) == ("10.0.0.7:5051", t.WorkerRole.HYBRID_ROLLOUT)


async def test_a_cancel_that_lands_as_the_loop_is_woken_still_stops_it(rig: Rig) -> None:
    """While every trajectory waits on a tool the loop sleeps on its wake-up event; a
    cancel arriving in the same pass as a wake-up must end it (3.11's wait_for returned
    the wake-up instead and the loop ran on; it wedged a test teardown for 300 s)."""
    rig.tools.gate = asyncio.Event()  # the tool call stays open: the loop idles
    rig.engine.queue("<calc>1+2</calc>", "<ans>3</ans>")
    await rig.place(make_task())
    for passes in range(4):  # how far the wake-up got before the cancel
        rig.start()
        await wait_until(lambda: len(rig.core._wakeup._waiters) > 0)  # type: ignore[attr-defined]
        rig.core._wakeup.set()  # as a tool return does
        for _ in range(passes):
            await asyncio.sleep(0)
        rig.task.cancel()
        done, _ = await asyncio.wait([rig.task], timeout=DEFAULT_TIMEOUT_S)
        assert done, f"the loop ran on after a cancel {passes} pass(es) after its wake-up"
    rig.task = None
    rig.tools.gate.set()  # and a loop started again finishes the trajectory
    (traj,) = await rig.run_until_published()
    assert traj.status is t.TrajectoryStatus.FINISHED


async def test_a_cancel_swallowed_below_the_loop_still_stops_it(rig: Rig) -> None:
    """redis-py sends each command through 3.11's wait_for, which can drop a cancel that
    lands as the send completes; the loop notices the cancel still pending at its next
    pass (a teardown once waited 300 s for a loop that went on)."""
    entered, release = asyncio.Event(), asyncio.Event()
    real_job_state = rig.core._store.job_state

    async def job_state_dropping_a_cancel(job_id: str) -> str | None:
        entered.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            pass  # as wait_for does when its awaitable finished in the same pass
        return await real_job_state(job_id)

    rig.core._store.job_state = job_state_dropping_a_cancel  # type: ignore[method-assign]
    rig.engine.queue("<calc>1+2</calc>")
    await rig.place(make_task())
    rig.start()
    await entered.wait()  # the loop is reading the job's state
    rig.task.cancel()
    done, _ = await asyncio.wait([rig.task], timeout=DEFAULT_TIMEOUT_S)
    release.set()
    assert done and rig.task.cancelled()
    rig.task = None
