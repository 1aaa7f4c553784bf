"""Pure GRPO bookkeeping: advantages, staleness, complete-group buffering."""

from __future__ import annotations

import math

import pytest

from libra import types as t
from services.trainer.grpo import GroupBuffer, group_advantages, staleness, to_samples


def make_trajectory(index: int = 0, group: str = "g-0", versions: tuple[int, ...] = (0, 0),
                    reward: float = 1.0) -> t.Trajectory:
    """Two prompt tokens (mask 0), then one model token per entry of ``versions``."""
    n = len(versions)
    return t.Trajectory(
        t.TrajectoryId(f"tr-{group}-{index}"), t.JobId("job-1"), t.GroupId(group),
        t.PromptId("p"), "Q:1+2=", "3", status=t.TrajectoryStatus.FINISHED,
        token_ids=[1, 2] + [3] * n, num_prompt_tokens=2, loss_mask=[0, 0] + [1] * n,
        logprobs=[0.0, 0.0] + [-0.1] * n, token_versions=[-1, -1, *versions], reward=reward)


# -- advantages ----------------------------------------------------------------------------

def test_advantages_of_two_rewards_are_plus_minus_one() -> None:
    assert group_advantages([3.0, 1.0]) == pytest.approx([1.0, -1.0], abs=1e-5)


def test_advantages_are_normalised_by_population_std() -> None:
    std = math.sqrt(2 / 3)
    assert group_advantages([1.0, 2.0, 3.0]) == pytest.approx([-1 / std, 0.0, 1 / std],
                                                              rel=1e-5)


def test_advantages_with_binary_rewards() -> None:
    # mean 0.25, std sqrt(0.1875)
    std = math.sqrt(0.1875)
    assert group_advantages([1.0, 0.0, 0.0, 0.0]) == pytest.approx(
        [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std], rel=1e-5)


def test_advantages_of_a_group_without_variance_are_zero() -> None:
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]


def test_advantage_of_a_singleton_is_its_raw_reward() -> None:
    assert group_advantages([0.7]) == [0.7]


# -- staleness -----------------------------------------------------------------------------

def test_staleness_counts_from_the_oldest_model_token() -> None:
    assert staleness(5, make_trajectory(versions=(3, 4, 5))) == 2


def test_staleness_ignores_prompt_and_tool_tokens() -> None:
    traj = make_trajectory(versions=(4,))
    traj.token_ids.append(9)
    traj.loss_mask.append(0)
    traj.logprobs.append(0.0)
    traj.token_versions.append(-1)
    assert staleness(4, traj) == 0


def test_staleness_of_a_trajectory_without_model_tokens_is_zero() -> None:
    assert staleness(7, make_trajectory(versions=())) == 0


# -- GroupBuffer ---------------------------------------------------------------------------

def test_group_is_complete_at_group_size() -> None:
    buf = GroupBuffer(group_size=2)
    buf.add("e0", make_trajectory(0))
    assert buf.complete() == []
    buf.add("e1", make_trajectory(1))
    assert buf.complete() == ["g-0"]


def test_the_same_trajectory_does_not_count_twice_towards_a_group() -> None:
    buf = GroupBuffer(group_size=2)
    buf.add("e0", make_trajectory(0))
    buf.add("e1", make_trajectory(0))
    assert buf.complete() == []


def test_take_returns_members_with_entry_ids_and_removes_the_group() -> None:
    buf = GroupBuffer(group_size=2)
    a, b = make_trajectory(0), make_trajectory(1)
    buf.add("e0", a)
    buf.add("e1", b)
    assert buf.take(["g-0"]) == [("e0", a), ("e1", b)]
    assert buf.complete() == [] and buf.groups == {}


def test_break_group_returns_held_members_with_the_reason() -> None:
    buf = GroupBuffer(group_size=3)
    a = make_trajectory(0)
    buf.add("e0", a)
    assert buf.break_group("g-0", "dropped_stale") == [("e0", a, "dropped_stale")]
    assert buf.groups == {}


def test_late_member_of_a_broken_group_is_dropped_with_the_first_reason() -> None:
    buf = GroupBuffer(group_size=2)
    buf.break_group("g-0", "dropped_failed")
    buf.break_group("g-0", "dropped_stale")
    late = make_trajectory(1)
    assert buf.add("e1", late) == [("e1", late, "dropped_failed")]
    assert buf.complete() == []


def test_other_groups_are_unaffected_by_a_broken_group() -> None:
    buf = GroupBuffer(group_size=1)
    buf.break_group("g-0", "dropped_failed")
    buf.add("e1", make_trajectory(0, group="g-1"))
    assert buf.complete() == ["g-1"]


# -- split episodes (earlier segments) ------------------------------------------------------

def with_segment(traj: t.Trajectory, version: int = 0) -> t.Trajectory:
    traj.segments = [t.Segment([1, 5, 6], 1, [0, 1, 1], [0.0, -0.2, -0.3], [-1, version, version])]
    return traj


def test_a_split_trajectory_gives_one_sample_per_sequence_with_its_advantage() -> None:
    split = with_segment(make_trajectory(0, reward=1.0))
    samples = to_samples([split, make_trajectory(1, reward=0.0)])
    assert [(s.trajectory_id, s.token_ids, round(s.advantage, 4)) for s in samples] == [
        ("tr-g-0-0", [1, 5, 6], 1.0), ("tr-g-0-0", [1, 2, 3, 3], 1.0),
        ("tr-g-0-1", [1, 2, 3, 3], -1.0)]
    assert samples[0].rollout_logprobs == [0.0, -0.2, -0.3]


def test_staleness_counts_the_oldest_token_of_every_segment() -> None:
    assert staleness(5, with_segment(make_trajectory(versions=(4, 4)), version=1)) == 4


def test_a_misaligned_segment_is_named() -> None:
    traj = with_segment(make_trajectory())
    traj.segments[0].logprobs.pop()
    assert traj.check_aligned() == "segments[0].logprobs has 2 entries, token_ids has 3"
