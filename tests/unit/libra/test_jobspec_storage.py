"""Spec fields of storage and warm starts: ``algorithm.init_from`` (and its rule for the
warm start) and ``algorithm.keep_weight_versions``."""

from __future__ import annotations

import pytest

from libra.errors import InvalidArgument
from libra.jobspec import job_spec_from_json, parse_job_spec


def test_init_from_skips_the_warm_start_unless_sft_steps_is_given() -> None:
    spec = parse_job_spec('[algorithm]\ninit_from = "job-a"\n')
    assert spec.algorithm.sft_steps == 0
    given = parse_job_spec('[algorithm]\ninit_from = "job-a"\nsft_steps = 50\n')
    assert given.algorithm.sft_steps == 50


def test_without_init_from_the_warm_start_default_stays() -> None:
    assert parse_job_spec("[algorithm]\n").algorithm.sft_steps == 2600


def test_the_stored_spec_reloads_with_the_same_warm_start() -> None:
    spec = parse_job_spec('[algorithm]\ninit_from = "/runs/job-a"\n')
    assert job_spec_from_json(spec.to_json()) == spec


def test_init_from_with_spaces_is_refused() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_job_spec('[algorithm]\ninit_from = " job-a"\n')
    assert err.value.field == "algorithm.init_from"


def test_keep_weight_versions_defaults_to_three_and_refuses_negatives() -> None:
    assert parse_job_spec("").algorithm.keep_weight_versions == 3
    with pytest.raises(InvalidArgument) as err:
        parse_job_spec("[algorithm]\nkeep_weight_versions = -1\n")
    assert err.value.field == "algorithm.keep_weight_versions"
