"""The held-out eval fields of ``[task]`` (libra/taskspec.py): defaults, and each rule
refused naming its field."""

from __future__ import annotations

import pytest

from libra.errors import InvalidArgument
from libra.jobspec import job_spec_from_json, parse_job_spec

HELD_OUT = "[task]\neval_fraction = 0.1\n"


def refused(text: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        parse_job_spec(text)
    return err.value


def test_eval_is_off_by_default_with_greedy_single_samples() -> None:
    task = parse_job_spec("").task
    assert (task.eval_interval, task.eval_samples_per_prompt, task.eval_temperature,
            task.eval_max_prompts, task.eval_correct_reward) == (0, 1, 0.0, 64, 1.0)


def test_eval_spec_parses_and_round_trips() -> None:
    spec = parse_job_spec(HELD_OUT + "eval_interval = 5\neval_samples_per_prompt = 4\n"
                          "eval_temperature = 0.6\neval_max_prompts = 16\n")
    assert (spec.task.eval_interval, spec.task.eval_samples_per_prompt) == (5, 4)
    assert job_spec_from_json(spec.to_json()) == spec


def test_eval_interval_without_held_out_rows_is_refused() -> None:
    err = refused("[task]\neval_interval = 5\n")
    assert err.field == "task.eval_interval" and "eval_path or task.eval_fraction" in err.reason


def test_eval_fields_are_not_checked_while_eval_is_off() -> None:
    assert parse_job_spec("[task]\neval_samples_per_prompt = 0\n").task.eval_interval == 0


@pytest.mark.parametrize(("line", "field", "reason"), [
    ("eval_interval = -1", "task.eval_interval", ">= 0"),
    ("eval_interval = 2\neval_samples_per_prompt = 0", "task.eval_samples_per_prompt", "[1, 64]"),
    ("eval_interval = 2\neval_samples_per_prompt = 65", "task.eval_samples_per_prompt",
     "[1, 64]"),
    ("eval_interval = 2\neval_samples_per_prompt = 4", "task.eval_samples_per_prompt",
     "eval_temperature > 0"),
    ("eval_interval = 2\neval_temperature = -0.5", "task.eval_temperature", ">= 0"),
    ("eval_interval = 2\neval_temperature = nan", "task.eval_temperature", "finite"),
    ("eval_interval = 2\neval_max_prompts = 0", "task.eval_max_prompts", "[1, 10000]"),
    ("eval_interval = 2\neval_correct_reward = inf", "task.eval_correct_reward", "finite"),
    ("eval_interval = 2\neval_timeout_s = 0.0", "task.eval_timeout_s", "> 0"),
])
def test_bad_eval_field_is_refused_naming_it(line: str, field: str, reason: str) -> None:
    err = refused(HELD_OUT + line + "\n")
    assert err.field == field and reason in err.reason
