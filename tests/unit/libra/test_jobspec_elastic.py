"""Job spec validation of the optional ``[elastic]`` table (strict; errors name the field)."""

from __future__ import annotations

import pytest

from libra import errors
from libra.jobspec import ElasticSpec, job_spec_from_dict, parse_job_spec
from tests.integration.stack_helpers import ROOT


def refused(elastic: dict) -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as info:
        job_spec_from_dict({"elastic": elastic})
    return info.value


def test_elastic_is_off_by_default_with_documented_defaults() -> None:
    e = job_spec_from_dict({}).elastic
    assert e == ElasticSpec()
    assert (e.enabled, e.reserve_workers, e.borrow_ratio, e.release_ratio,
            e.pressure_threshold, e.ttl_steps, e.plan_interval_steps, e.cooldown_steps,
            e.warmup_steps, e.transition_cost_s, e.min_gain_ratio, e.join_timeout_s,
            e.gradient_deadline_s, e.lockstep_check_interval) == (
        False, 1, 1.15, 0.90, 0.80, 20, 5, 1, 2, 1.0, 0.05, 60.0, 10.0, 1)


def test_elastic_table_sets_knobs_and_accepts_ints_for_seconds() -> None:
    spec = parse_job_spec("[elastic]\nenabled = true\njoin_timeout_s = 30\n")
    assert spec.elastic.enabled and spec.elastic.join_timeout_s == 30.0


def test_release_ratio_must_stay_below_borrow_ratio() -> None:
    err = refused({"borrow_ratio": 1.1, "release_ratio": 1.2})
    assert err.field == "elastic.release_ratio" and "1.2 >= 1.1" in err.reason


@pytest.mark.parametrize(("knob", "value"), [
    ("reserve_workers", 0), ("ttl_steps", 0), ("plan_interval_steps", 0),
    ("lockstep_check_interval", 0), ("cooldown_steps", -1), ("warmup_steps", -1),
    ("pressure_threshold", 0.0), ("pressure_threshold", 1.5), ("transition_cost_s", -1.0),
    ("min_gain_ratio", -0.1), ("join_timeout_s", 0.0), ("gradient_deadline_s", -2.0),
    ("borrow_ratio", float("inf")),
])
def test_out_of_range_knob_is_refused_naming_it(knob: str, value: float) -> None:
    assert refused({knob: value}).field == f"elastic.{knob}"


def test_unknown_or_mistyped_elastic_key_is_refused() -> None:
    assert refused({"enable": True}).field == "elastic.enable"
    assert refused({"enabled": "yes"}).field == "elastic.enabled"
    assert refused({"reserve_workers": 1.5}).field == "elastic.reserve_workers"


def test_demo_elastic_config_is_the_demo_with_elastic_on() -> None:
    demo = parse_job_spec((ROOT / "deploy/configs/demo.toml").read_text())
    elastic = parse_job_spec((ROOT / "deploy/configs/demo-elastic.toml").read_text())
    assert elastic.elastic == ElasticSpec(enabled=True)
    assert (elastic.model, elastic.task, elastic.algorithm, elastic.layout) == (
        demo.model, demo.task, demo.algorithm, demo.layout)
