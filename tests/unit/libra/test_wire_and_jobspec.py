"""Proto <-> domain converters, status <-> error mapping, Trajectory invariants and the
job spec parser. Everything is real (no I/O)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from libra import errors
from libra import types as t
from libra.jobspec import JobSpec, job_spec_from_json, parse_job_spec
from libra.proto.common.v1 import common_pb2
from libra.wire.common import (
    decode_trajectory,
    encode_trajectory,
    lease_from_proto,
    lease_to_proto,
    role_from_proto,
)
from libra.wire.coordinator import job_from_proto, job_state_from_proto, job_to_proto


def make_trajectory(num_turns: int = 2, reward: float = 1.0) -> t.Trajectory:
    """A finished trajectory with every field set to a non-default value."""
    prompt, per_turn = 3, 2
    n = prompt + per_turn * num_turns
    mask = [0] * prompt + [1, 0] * num_turns
    return t.Trajectory(
        trajectory_id=t.TrajectoryId("job:g0:p0:s1"), job_id=t.JobId("job"),
        group_id=t.GroupId("job:g0:p0"), prompt_id=t.PromptId("p0"), prompt_text="2+2?",
        reference="4", status=t.TrajectoryStatus.FINISHED, failure_reason="none",
        token_ids=list(range(10, 10 + n)), num_prompt_tokens=prompt, loss_mask=mask,
        logprobs=[-0.5 * i for i in range(n)], token_versions=[0] * prompt + [1, 2] * num_turns,
        reward=reward, num_turns=num_turns,
        tool_states=[t.ToolReturnState("calculator", t.SizeClass.SMALL, t.ToolStatus.SUCCESS),
                     t.ToolReturnState("search", t.SizeClass.LARGE, t.ToolStatus.TIMEOUT),
                     t.ToolReturnState("code", t.SizeClass.MEDIUM, t.ToolStatus.FAILURE)],
        tool_return_positions=[4, 6], instance_id="rollout-1", bucket="long",
        num_migrations=1, created_at_ms=111, finished_at_ms=222, final_text="4", attempt=2,
        partial_turn_tokens=1,
        prompt_messages_json='[{"content": "2+2?", "role": "user"}]',
        reward_components={"exact_match": 1.0, "format": 0.5},
        metadata_json='{"source": "gsm8k"}', eval_round=3,
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        # (an earlier sequence of a split episode; none when nothing was sampled)
        segments=[t.Segment([7, 8, 9], 1, [0, 1, 1], [0.0, -0.5, -0.25], [-1, 1, 1])]
        if num_turns else [])


def test_trajectory_builder_sets_every_field() -> None:
    # So the round trip below covers a field added later (the wire must carry it).
    traj, blank = make_trajectory(), t.Trajectory(
        t.TrajectoryId(""), t.JobId(""), t.GroupId(""), t.PromptId(""), "", "")
    same = [f.name for f in dataclasses.fields(t.Trajectory)
            if getattr(traj, f.name) == getattr(blank, f.name)]
    assert same == []


# -- wire -----------------------------------------------------------------------------


def test_trajectory_round_trips_through_bytes_with_every_field() -> None:
    traj = make_trajectory()
    assert decode_trajectory(encode_trajectory(traj)) == traj


def test_trajectory_round_trip_keeps_float_reward_and_logprobs() -> None:
    traj = make_trajectory(reward=0.25)
    back = decode_trajectory(encode_trajectory(traj))
    assert back.reward == 0.25
    assert back.logprobs == pytest.approx(traj.logprobs)


def test_empty_running_trajectory_round_trips() -> None:
    traj = t.Trajectory(t.TrajectoryId("a"), t.JobId("j"), t.GroupId("g"), t.PromptId("p"),
                        "prompt", "ref")
    assert decode_trajectory(encode_trajectory(traj)) == traj


@pytest.mark.parametrize("role", list(t.WorkerRole))
def test_lease_round_trips_for_every_role(role: t.WorkerRole) -> None:
    lease = t.Lease(t.WorkerId("w"), role, "short", "h:1", 7, 123_456, 3_000)
    assert lease_from_proto(lease_to_proto(lease)) == lease


def test_unknown_role_raises_invalid_argument_naming_role() -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        role_from_proto(common_pb2.WORKER_ROLE_UNSPECIFIED)
    assert info.value.field == "role"


@pytest.mark.parametrize("state", list(t.JobState))
def test_job_round_trips_for_every_state(state: t.JobState) -> None:
    job = t.Job(t.JobId("j-1"), "name", state, '{"a": 1}', 1, 2, "msg", 3, 4, "/runs/j-1")
    assert job_from_proto(job_to_proto(job)) == job


def test_unknown_job_state_raises_invalid_argument_naming_state() -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        job_state_from_proto(0)
    assert info.value.field == "state"


# -- errors ---------------------------------------------------------------------------


def test_invalid_argument_status_keeps_field_and_reason() -> None:
    err = errors.error_from_status("INVALID_ARGUMENT",
                                   "layout.buckets: max_tokens must be: increasing")
    assert isinstance(err, errors.InvalidArgument)
    assert (err.field, err.reason) == ("layout.buckets", "max_tokens must be: increasing")


@pytest.mark.parametrize("cls", [errors.NotFound, errors.AlreadyExists,
                                 errors.FailedPrecondition, errors.LeaseConflict,
                                 errors.LeaseLost, errors.ResourceExhausted,
                                 errors.Unavailable, errors.DeadlineExceeded, errors.Internal])
def test_status_code_maps_back_to_the_raised_class(cls: type[errors.LibraError]) -> None:
    err = errors.error_from_status(cls.grpc_status_name, "details")
    assert type(err) is cls
    assert str(err) == "details"


def test_invalid_argument_round_trips_through_its_status_details() -> None:
    raised = errors.InvalidArgument("ttl_ms", "must be in [200, 600000]")
    back = errors.error_from_status(raised.grpc_status_name, str(raised))
    assert (back.field, back.reason) == (raised.field, raised.reason)


def test_unmapped_status_becomes_internal() -> None:
    assert type(errors.error_from_status("UNIMPLEMENTED", "x")) is errors.Internal


def test_only_transient_errors_are_retryable() -> None:
    retryable = {c.__name__ for c in (errors.ResourceExhausted, errors.Unavailable,
                                      errors.DeadlineExceeded) if c.retryable}
    assert retryable == {"ResourceExhausted", "Unavailable", "DeadlineExceeded"}
    assert not errors.LeaseLost.retryable and not errors.InvalidArgument.retryable


# -- Trajectory -----------------------------------------------------------------------


def test_aligned_trajectory_has_no_alignment_problem() -> None:
    assert make_trajectory().check_aligned() is None


@pytest.mark.parametrize("field", ["loss_mask", "logprobs", "token_versions"])
def test_misaligned_token_array_is_reported_by_name(field: str) -> None:
    traj = make_trajectory()
    getattr(traj, field).pop()
    assert field in (traj.check_aligned() or "")


def test_prompt_longer_than_tokens_is_reported() -> None:
    traj = make_trajectory()
    traj.num_prompt_tokens = len(traj.token_ids) + 1
    assert "num_prompt_tokens" in (traj.check_aligned() or "")


@pytest.mark.parametrize("partial", [-1, 5])
def test_partial_turn_outside_the_generated_tokens_is_reported(partial: int) -> None:
    traj = make_trajectory()  # 4 tokens after the prompt
    traj.partial_turn_tokens = partial
    assert "partial_turn_tokens" in (traj.check_aligned() or "")


def test_min_version_counts_only_model_tokens() -> None:
    traj = make_trajectory()  # prompt tokens at version 0 are masked out
    assert traj.min_version == 1


def test_min_version_without_model_tokens_is_minus_one() -> None:
    traj = make_trajectory(num_turns=0)
    assert traj.min_version == -1


def test_tool_state_key_round_trips() -> None:
    state = t.ToolReturnState("my:tool", t.SizeClass.MEDIUM, t.ToolStatus.TIMEOUT)
    assert t.ToolReturnState.from_key(state.key) == state


# -- job spec -------------------------------------------------------------------------

SPEC = {"name": "fmt", "algorithm": {"num_steps": 7, "learning_rate": 0.01},
        "tools": {"enabled": ["calculator"]},
        "layout": {"policy": "cmlfq",
                   "buckets": [{"name": "s", "max_tokens": 64},
                               {"name": "l", "max_tokens": 256, "tp_degree": 2}]}}
TOML = """
name = "fmt"
[algorithm]
num_steps = 7
learning_rate = 0.01
[tools]
enabled = ["calculator"]
[layout]
policy = "cmlfq"
[[layout.buckets]]
name = "s"
max_tokens = 64
[[layout.buckets]]
name = "l"
max_tokens = 256
tp_degree = 2
"""
YAML = """
name: fmt
algorithm: {num_steps: 7, learning_rate: 0.01}
tools:
  enabled: [calculator]
layout:
  policy: cmlfq
  buckets:
    - {name: s, max_tokens: 64}
    - {name: l, max_tokens: 256, tp_degree: 2}
"""


def test_toml_json_and_yaml_specs_parse_to_the_same_spec() -> None:
    from_toml = parse_job_spec(TOML, "toml")
    assert parse_job_spec(json.dumps(SPEC), "json") == from_toml
    assert parse_job_spec(YAML, "yaml") == from_toml
    assert parse_job_spec(YAML, "YML") == from_toml
    assert from_toml.layout.buckets[1].tp_degree == 2


def test_empty_spec_gets_all_defaults() -> None:
    spec = parse_job_spec("", "toml")
    assert spec == JobSpec()
    assert [b.name for b in spec.layout.buckets] == ["short", "long"]
    assert (spec.algorithm.samples_per_prompt, spec.tools.enabled) == (4, ["calculator"])


def test_int_is_accepted_where_a_float_is_expected() -> None:
    spec = parse_job_spec("[algorithm]\nlearning_rate = 1", "toml")
    assert spec.algorithm.learning_rate == 1.0 and isinstance(spec.algorithm.learning_rate,
                                                              float)


def test_stored_spec_json_loads_back_to_the_same_spec() -> None:
    spec = parse_job_spec(TOML, "toml")
    assert job_spec_from_json(spec.to_json()) == spec


@pytest.mark.parametrize(("text", "fmt", "field"), [
    ("name: [", "yaml", "spec"),
    ("{", "json", "spec"),
    ("[1, 2]", "json", "spec"),
    ("name = true", "toml", "name"),
    ("[algorithm]\nnum_steps = true", "toml", "algorithm.num_steps"),
    ("[algorithm]\nsamples_per_prompt = 1", "toml", "algorithm.samples_per_prompt"),
    ("[model]\nhidden_size = 130", "toml", "model.hidden_size"),
    ("[[layout.buckets]]\nmax_tokens = 5", "toml", "layout.buckets[0].name"),
    ("[layout]\nbuckets = [{name = \"a\", max_tokens = 9}, {name = \"a\", max_tokens = 99}]",
     "toml", "layout.buckets"),
    ("[layout]\npolicy = \"\"", "toml", "layout.policy"),
    ("[task]\ntool_call_format = \"xml\"", "toml", "task.tool_call_format"),
    ("[model]\ntool_template = \"jinja\"", "toml", "model.tool_template"),
    ("model = 3", "toml", "model"),
])
def test_invalid_spec_names_the_field(text: str, fmt: str, field: str) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        parse_job_spec(text, fmt)
    assert info.value.field == field


def test_spec_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        parse_job_spec("", "toml").name = "x"  # type: ignore[misc]
