"""The step record's one codec (libra/wire/step_record.py): a round trip keeps the JSON
the trainer always sent, and a malformed record is refused naming the field."""

from __future__ import annotations

import json
import math

import pytest

from libra.errors import InvalidArgument
from libra.limits import MAX_STEP_JSON_BYTES
from libra.types import StepRecord
from libra.wire.step_record import (
    step_record_from_dict,
    step_record_from_json,
    step_record_to_dict,
    step_record_to_json,
)

# A record as the trainer sent it before the dataclass (a publishing, checkpointing step).
TRAINER_JSON = {
    "reward_mean": 0.625, "num_trajectories": 8, "rollout_s": 1.25, "train_s": 0.5,
    "dropped_stale": 1, "dropped_failed": 0, "reward_components": {"correct": 0.5},
    "turns_mean": 2.0, "tokens_mean": 31.5, "hybrid_workers": 0, "hybrid_joining": 0,
    "loss": 0.012345, "grad_norm": 1.5, "num_tokens": 252.0, "is_skipped": 0.0,
    "migrations": 2, "bucket_occupancy": {"b0": 5, "b1": 3}, "publish_s": 0.1,
    "weights_pruned": 1, "step": 4, "policy_version": 4, "wall_s": 2.0, "checkpoint_s": 0.3,
}


def test_round_trip_keeps_the_json_shape() -> None:
    record = step_record_from_json(json.dumps(TRAINER_JSON))
    assert record.step == 4 and record.policy_version == 4
    assert record.bucket_occupancy == {"b0": 5, "b1": 3}
    assert record.metrics == {"loss": 0.012345, "grad_norm": 1.5, "num_tokens": 252.0,
                              "is_skipped": 0.0}
    assert json.loads(step_record_to_json(record)) == TRAINER_JSON
    assert step_record_from_dict(step_record_to_dict(record)) == record


def test_fields_not_reported_stay_out_of_the_json() -> None:
    """Old runs' records and the coordinator tests' minimal ones decode and encode as
    they were (no invented defaults)."""
    for data in ({"step": 1}, {"step": 2, "policy_version": 1, "reward_mean": 0.5}):
        assert step_record_to_dict(step_record_from_dict(data)) == data
    assert step_record_to_dict(StepRecord(step=3)) == {"step": 3}


def test_a_skipped_steps_infinite_grad_norm_survives() -> None:
    text = step_record_to_json(StepRecord(step=1, metrics={"grad_norm": math.inf}))
    assert step_record_from_json(text).metrics["grad_norm"] == math.inf


@pytest.mark.parametrize(("data", "field"), [
    ({"policy_version": 1}, "step_json.step"),
    ({"step": 1, "note": "hi"}, "step_json.note"),
    ({"step": 1, "loss": [1.0]}, "step_json.loss"),
    ({"step": 1, "metrics": {"loss": 1.0}}, "step_json.metrics"),
    ({"step": "1"}, "step_json.step"),
    ({"step": True}, "step_json.step"),
    ({"step": -1}, "step_json.step"),
    ({"step": 10**9}, "step_json.step"),
    ({"step": 1, "policy_version": -2}, "step_json.policy_version"),
    ({"step": 1, "policy_version": 1.5}, "step_json.policy_version"),
    ({"step": 1, "reward_mean": "high"}, "step_json.reward_mean"),
    ({"step": 1, "wall_s": None}, "step_json.wall_s"),
    ({"step": 1, "bucket_occupancy": {"b0": 1.5}}, "step_json.bucket_occupancy"),
    ({"step": 1, "reward_components": ["x"]}, "step_json.reward_components"),
    ([1, 2], "step_json"),
])
def test_malformed_records_name_the_field(data: object, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        step_record_from_json(json.dumps(data))
    assert err.value.field == field


def test_bad_json_and_oversized_text_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="not valid JSON") as err:
        step_record_from_json("{step: 1")
    assert err.value.field == "step_json"
    with pytest.raises(InvalidArgument, match="at most") as err:
        step_record_from_json(" " * (MAX_STEP_JSON_BYTES + 1))
    assert err.value.field == "step_json"
    with pytest.raises(InvalidArgument, match="surrogate"):
        step_record_from_json('{"step": 1, "reward_components": {"\\ud800": 1}}')
