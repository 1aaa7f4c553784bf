"""One bucket type: the job spec's ``[[layout.buckets]]`` are ``libra.types.Bucket``,
and the scheduler's layout takes them as they are. Everything is real (no I/O)."""

from __future__ import annotations

import pytest

from libra import errors
from libra import types as t
from libra.jobspec import job_spec_from_json, parse_job_spec
from services.scheduler.job_run import build_layout

SPEC = """
[[layout.buckets]]
name = "s"
max_tokens = 64
[[layout.buckets]]
name = "l"
max_tokens = 256
tp_degree = 2
max_batch_size = 4
max_trajectories_per_instance = 9
"""


def test_spec_buckets_are_the_shared_bucket_type() -> None:
    spec = parse_job_spec(SPEC, "toml")
    assert spec.layout.buckets == [t.Bucket("s", 64), t.Bucket("l", 256, 2, 4, 9)]
    assert all(type(b) is t.Bucket for b in spec.layout.buckets)


def test_spec_buckets_survive_the_stored_json() -> None:
    spec = parse_job_spec(SPEC, "toml")
    assert job_spec_from_json(spec.to_json()).layout.buckets == spec.layout.buckets


def test_layout_finds_a_bucket_by_name_or_none() -> None:
    layout = parse_job_spec(SPEC, "toml").layout
    assert layout.bucket("l") == t.Bucket("l", 256, 2, 4, 9)
    assert layout.bucket("medium") is None


def test_scheduler_layout_holds_the_spec_buckets_unchanged() -> None:
    spec = parse_job_spec(SPEC, "toml")
    assert list(build_layout(spec).buckets) == spec.layout.buckets


def test_bucket_with_an_unknown_field_names_it() -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        parse_job_spec('[[layout.buckets]]\nname = "s"\nmax_tokens = 9\ntp = 2', "toml")
    assert info.value.field == "layout.buckets[0].tp"
