"""``[task]`` dataset fields of the job spec (libra/taskspec.py): how ``kind`` and the
older ``name`` coexist, and every rule naming its field."""

from __future__ import annotations

import pytest

from libra.errors import InvalidArgument
from libra.jobspec import JobSpec, job_spec_from_json, parse_job_spec

FILE = ('[task]\nkind = "jsonl"\npath = "d.jsonl"\nprompt_field = "q"\n'
        'reference_field = "a"\n')
NO_SFT = "[algorithm]\nsft_steps = 0\n"
HF = '[model]\nkind = "hf"\npath = "m"\n'


def refused(text: str) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        parse_job_spec(text)
    return err.value


def test_spec_without_kind_keeps_meaning_the_builtin_name() -> None:
    task = parse_job_spec('[task]\nname = "calc-words"\n').task
    assert (task.kind, task.name, task.resolved_kind, task.is_file) == (
        "", "calc-words", "calc-words", False)
    assert parse_job_spec("").task == JobSpec().task


def test_kind_given_sets_name_to_kind() -> None:
    task = parse_job_spec('[task]\nkind = "calc-words"\n').task
    assert (task.kind, task.name) == ("calc-words", "calc-words")
    assert parse_job_spec('[task]\nkind = "arith"\nname = "arith"\n').task.name == "arith"


def test_name_that_conflicts_with_kind_is_refused() -> None:
    err = refused('[task]\nkind = "calc-words"\nname = "arith"\n')
    assert err.field == "task.name" and "conflicts with task.kind" in err.reason


def test_file_dataset_defaults_to_all_rows_and_round_trips() -> None:
    spec = parse_job_spec(FILE + NO_SFT)
    assert (spec.task.name, spec.task.num_prompts, spec.task.is_file) == ("jsonl", 0, True)
    assert job_spec_from_json(spec.to_json()) == spec
    assert parse_job_spec(FILE + "num_prompts = 64\n" + NO_SFT).task.num_prompts == 64


def test_order_seed_follows_seed_unless_shuffle_seed_is_set() -> None:
    assert parse_job_spec("[task]\nseed = 7\n").task.order_seed == 7
    assert parse_job_spec("[task]\nseed = 7\nshuffle_seed = 0\n").task.order_seed == 0


@pytest.mark.parametrize(("text", "field", "reason"), [
    ('[task]\nkind = "csv"\n', "task.kind", "one of"),
    ('[task]\nname = "jsonl"\n', "task.name", "one of ('arith', 'calc-words')"),
    ('[task]\nkind = "jsonl"\nprompt_field = "q"\nreference_field = "a"\n' + NO_SFT,
     "task.path", "required"),
    ('[task]\nkind = "jsonl"\npath = "d"\nreference_field = "a"\n' + NO_SFT,
     "task.prompt_field", "exactly one"),
    (FILE + 'messages_field = "m"\n' + NO_SFT, "task.prompt_field", "exactly one"),
    ('[task]\nkind = "jsonl"\npath = "d"\nprompt_field = "q"\n' + NO_SFT,
     "task.reference_field", "required"),
    (FILE + 'split = "test"\n' + NO_SFT, "task.split", "one split"),
    (FILE + 'metadata_field = " m"\n' + NO_SFT, "task.metadata_field", "spaces"),
    (FILE + "eval_fraction = 0.6\n" + NO_SFT, "task.eval_fraction", "[0, 0.5]"),
    (FILE + "eval_fraction = -0.1\n" + NO_SFT, "task.eval_fraction", "[0, 0.5]"),
    (FILE + 'eval_fraction = 0.1\neval_path = "e"\n' + NO_SFT, "task.eval_fraction",
     "not both"),
    (FILE + "shuffle_seed = -2\n" + NO_SFT, "task.shuffle_seed", ">= 0"),
    (FILE + "num_epochs = -1\n" + NO_SFT, "task.num_epochs", ">= 0"),
    (FILE + "num_prompts = 3\n" + NO_SFT, "task.num_prompts", "0 (all rows)"),
    (FILE, "algorithm.sft_steps", "demonstration_field"),
    ('[task]\npath = "d.jsonl"\n', "task.path", "only for file datasets"),
    ('[task]\nprompt_field = "q"\n', "task.prompt_field", "only for file datasets"),
    ('[task]\nkind = "calc-words"\neval_path = "e"\n', "task.eval_path", "only for file"),
    ('[task]\nsplit = "test"\n', "task.split", "only for hf-dataset"),
    ('[task]\nnum_prompts = 4\n', "task.num_prompts", ">= algorithm.prompts_per_step"),
    ('[task]\nkind = "jsonl"\npath = "d"\nmessages_field = "m"\nreference_field = "a"\n'
     + NO_SFT, "task.messages_field", "the arith tag agent"),
    (FILE + 'demonstration_field = "d"\n', "task.demonstration_field", "hermes"),
])
def test_bad_task_field_is_refused_by_name(text: str, field: str, reason: str) -> None:
    err = refused(text)
    assert err.field == field and reason in err.reason, str(err)


def test_chat_dataset_with_messages_and_demonstrations_is_accepted() -> None:
    spec = parse_job_spec(
        HF + '[task]\nkind = "hf-dataset"\npath = "ds"\nsplit = "test"\n'
        'messages_field = "m"\nreference_field = "a"\ndemonstration_field = "d"\n'
        'tool_call_format = "hermes"\neval_fraction = 0.1\nnum_epochs = 2\n')
    assert (spec.task.split, spec.task.eval_fraction, spec.task.num_epochs) == ("test", 0.1, 2)


def test_builtin_may_hold_out_a_fraction() -> None:
    assert parse_job_spec("[task]\neval_fraction = 0.25\n").task.eval_fraction == 0.25
