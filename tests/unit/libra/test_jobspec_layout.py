"""Job spec validation of the layout: buckets and the optional ``[layout.cmlfq]`` table.

Every bad layout is refused at submit time with ``InvalidArgument`` naming the field.
"""

from __future__ import annotations

import tomllib

import pytest

from libra import errors
from libra.jobspec import CmlfqSpec, job_spec_from_dict, parse_job_spec
from tests.integration.stack_helpers import ROOT

TWO = [{"name": "short", "max_tokens": 96}, {"name": "long", "max_tokens": 256}]


def refused(layout: dict) -> errors.InvalidArgument:
    with pytest.raises(errors.InvalidArgument) as info:
        job_spec_from_dict({"layout": layout})
    return info.value


def test_empty_layout_is_refused() -> None:
    err = refused({"buckets": []})
    assert (err.field, err.reason) == ("layout.buckets", "at least one bucket is required")


def test_thresholds_out_of_order_are_refused_showing_them() -> None:
    err = refused({"buckets": list(reversed(TWO))})
    assert err.field == "layout.buckets" and "[256, 96]" in err.reason


def test_equal_thresholds_are_refused() -> None:
    err = refused({"buckets": [{"name": "a", "max_tokens": 9}, {"name": "b", "max_tokens": 9}]})
    assert err.field == "layout.buckets" and "strictly increasing" in err.reason


@pytest.mark.parametrize("name", ["", "Short", "has space", "1st", "x" * 33])
def test_bad_bucket_name_is_refused_naming_the_entry(name: str) -> None:
    err = refused({"buckets": [{"name": "ok", "max_tokens": 9},
                               {"name": name, "max_tokens": 99}]})
    assert err.field == "layout.buckets[1].name"


def test_an_empty_policy_is_refused() -> None:
    err = refused({"policy": " "})
    assert err.field == "layout.policy" and "registry" in err.reason


def test_which_policies_exist_is_not_the_schemas_list() -> None:
    # The scheduling registry decides, at submit (tests/unit/coordinator/
    # test_coordinator_spec_registries.py); the foundation may not import it.
    assert job_spec_from_dict({"layout": {"policy": "fifo"}}).layout.policy == "fifo"


def test_cmlfq_table_is_optional_and_defaults_to_the_reference() -> None:
    assert job_spec_from_dict({"layout": {"policy": "cmlfq"}}).layout.cmlfq == CmlfqSpec()


def test_cmlfq_table_sets_knobs() -> None:
    spec = parse_job_spec('[layout]\npolicy = "cmlfq"\n[layout.cmlfq]\n'
                          "rebuild_interval_steps = 5\nbucket_thresholds_tokens = [50, 300]\n")
    assert spec.layout.cmlfq.rebuild_interval_steps == 5
    assert spec.layout.cmlfq.bucket_thresholds_tokens == [50, 300]


@pytest.mark.parametrize(("cmlfq", "field"), [
    ({"rebuild_every": 5}, "layout.cmlfq.rebuild_every"),
    ({"rebuild_interval_steps": -1}, "layout.cmlfq.rebuild_interval_steps"),
    ({"recent_window_trajectories": 0}, "layout.cmlfq.recent_window_trajectories"),
    ({"p90_window_samples": 0}, "layout.cmlfq.p90_window_samples"),
    ({"min_node_visits": 0}, "layout.cmlfq.min_node_visits"),
    ({"tree_persist_interval_finishes": -1}, "layout.cmlfq.tree_persist_interval_finishes"),
    ({"enable_fallback": 1}, "layout.cmlfq.enable_fallback"),
    ({"bucket_thresholds_tokens": [10]}, "layout.cmlfq.bucket_thresholds_tokens"),
    ({"bucket_thresholds_tokens": [300, 50]}, "layout.cmlfq.bucket_thresholds_tokens"),
    ({"bucket_thresholds_tokens": [0, 50]}, "layout.cmlfq.bucket_thresholds_tokens"),
])
def test_bad_cmlfq_knob_is_refused_naming_it(cmlfq: dict, field: str) -> None:
    assert refused({"policy": "cmlfq", "buckets": TWO, "cmlfq": cmlfq}).field == field


def test_demo_config_runs_cmlfq_on_short_and_long() -> None:
    data = tomllib.loads((ROOT / "deploy" / "configs" / "demo.toml").read_text())
    spec = job_spec_from_dict(data)
    assert spec.layout.policy == "cmlfq"
    assert [b.name for b in spec.layout.buckets] == ["short", "long"]


def test_tool_options_carry_the_job_level_settings() -> None:
    from libra.jobspec import ToolsSpec

    tools = ToolsSpec(enabled=["calculator", "search"], calculator_transient_failure_rate=0.1,
                      search_corpus=["/data/kb.txt"])
    assert tools.options_for("calculator") == {"transient_failure_rate": 0.1}
    assert tools.options_for("search") == {"corpus_paths": ["/data/kb.txt"]}
    assert tools.options_for("python") == {}


def test_arith_task_needs_the_calculator_first() -> None:
    import pytest

    from libra.errors import InvalidArgument
    from libra.jobspec import job_spec_from_dict

    with pytest.raises(InvalidArgument) as err:
        job_spec_from_dict({"tools": {"enabled": ["search", "calculator"]}})
    assert err.value.field == "tools.enabled"
    with pytest.raises(InvalidArgument) as err:
        job_spec_from_dict({"tools": {"search_corpus": [" "]}})
    assert err.value.field == "tools.search_corpus[0]"
