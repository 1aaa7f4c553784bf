"""Every input of a job spec is bounded (libra/spec_limits.py, docs/jobspec.md "Limits")."""

from __future__ import annotations

import json

import pytest

from libra.errors import InvalidArgument
from libra.jobspec import parse_job_spec
from libra.limits import MAX_NUM_STEPS, MAX_SPEC_BYTES
from libra.spec_limits import (
    MAX_BUCKETS,
    MAX_REWARD_COMPONENTS,
    MAX_TOOLS,
    physical_memory_bytes,
    tiny_llama_params,
)


def _field_of(text: str, fmt: str = "toml") -> str:
    with pytest.raises(InvalidArgument) as info:
        parse_job_spec(text, fmt)
    return info.value.field


def test_a_document_over_one_mib_is_refused_naming_spec() -> None:
    text = 'name = "big"\n#' + "x" * MAX_SPEC_BYTES + "\n"
    with pytest.raises(InvalidArgument, match="at most 1048576") as info:
        parse_job_spec(text)
    assert info.value.field == "spec"


def test_a_document_just_under_the_limit_parses() -> None:
    filler = "#" + "x" * (MAX_SPEC_BYTES - 100) + "\n"
    assert parse_job_spec('name = "ok"\n' + filler).name == "ok"


@pytest.mark.parametrize("doc", ['{"name": "\\ud800"}', '{"\\udfff": 1}',
                                 '{"task": {"system_prompt": "a\\ud83d"}}'])
def test_a_lone_surrogate_in_a_json_spec_names_spec(doc: str) -> None:
    assert _field_of(doc, "json") == "spec"


def test_deep_nesting_is_invalid_not_a_crash() -> None:
    assert _field_of('{"name": ' + "[" * 100_000 + "]" * 100_000 + "}", "json") == "spec"


@pytest.mark.parametrize("name, why", [
    ("x" * 129, "at most 128"), ("a\nforged log line", "printable"), ("tab\there", "printable"),
    ("nul\x00", "printable"), ("   ", "must not be empty")])
def test_job_names_are_short_and_printable(name: str, why: str) -> None:
    with pytest.raises(InvalidArgument, match=why) as info:
        parse_job_spec(json.dumps({"name": name}), "json")
    assert info.value.field == "name"


def test_a_128_character_unicode_name_is_fine() -> None:
    assert parse_job_spec(json.dumps({"name": "é" * 128}), "json").name == "é" * 128


@pytest.mark.parametrize("section, field, value", [
    ("algorithm", "num_steps", 2**63 - 1), ("algorithm", "num_steps", MAX_NUM_STEPS + 1),
    ("algorithm", "learning_rate", float("inf")), ("algorithm", "learning_rate", 2.0),
    ("algorithm", "max_grad_norm", float("nan")), ("algorithm", "max_grad_norm", 0.0),
    ("algorithm", "clip_eps", float("nan")), ("algorithm", "kl_coef", float("inf")),
    ("algorithm", "prompts_per_step", 10**6), ("algorithm", "sft_batch_size", 10**6),
    ("algorithm", "sft_learning_rate", -1.0), ("algorithm", "temperature", float("nan")),
    ("algorithm", "seed", 2**64), ("tools", "call_timeout_s", 1e9),
    ("model", "hidden_size", 1 << 20), ("model", "num_layers", 4096),
    ("elastic", "join_timeout_s", float("inf")), ("task", "num_prompts", 10**9),
])
def test_numbers_are_finite_and_below_their_maximum(section: str, field: str,
                                                     value: float) -> None:
    doc = json.dumps({section: {field: value}})  # NaN / Infinity: Python's JSON extension
    assert _field_of(doc, "json") == f"{section}.{field}"


def test_toml_inf_and_nan_are_refused() -> None:
    assert _field_of("[algorithm]\nlearning_rate = inf\n") == "algorithm.learning_rate"
    assert _field_of("[algorithm]\nmax_grad_norm = nan\n") == "algorithm.max_grad_norm"


def test_a_model_bigger_than_this_machine_is_refused() -> None:
    # 64 layers of width 8192 (MLP 32768): ~69 B parameters, ~1.1 TB to train.
    model = {"hidden_size": 8192, "num_layers": 64, "num_heads": 64,
             "intermediate_size": 32768}
    params = tiny_llama_params(type("M", (), model))
    assert params * 16 > physical_memory_bytes() > 0
    with pytest.raises(InvalidArgument, match="GiB to train") as info:
        parse_job_spec(json.dumps({"model": model}), "json")
    assert info.value.field == "model.hidden_size"


def _buckets(n: int) -> list[dict]:
    return [{"name": f"b{i}", "max_tokens": 16 * (i + 1)} for i in range(n)]


def test_at_most_64_buckets() -> None:
    ok = parse_job_spec(json.dumps({"layout": {"buckets": _buckets(MAX_BUCKETS)}}), "json")
    assert len(ok.layout.buckets) == MAX_BUCKETS
    doc = json.dumps({"layout": {"buckets": _buckets(10_000)}})
    with pytest.raises(InvalidArgument, match="10000 entries, at most 64") as info:
        parse_job_spec(doc, "json")
    assert info.value.field == "layout.buckets"


def test_bucket_sizes_have_maxima() -> None:
    doc = json.dumps({"layout": {"buckets": [{"name": "b", "max_tokens": 2**40}]}})
    assert _field_of(doc, "json") == "layout.buckets[0].max_tokens"


def test_tool_and_reward_component_counts_are_bounded() -> None:
    tools = ["calculator"] + [f"t{i}" for i in range(MAX_TOOLS)]
    assert _field_of(json.dumps({"tools": {"enabled": tools}}), "json") == "tools.enabled"
    components = [{"name": f"r{i}", "weight": 1.0} for i in range(MAX_REWARD_COMPONENTS + 1)]
    doc = json.dumps({"reward": {"name": "composite", "components": components}})
    assert _field_of(doc, "json") == "reward.components"


def test_tool_and_reward_names_are_bounded_plugin_names() -> None:
    doc = json.dumps({"tools": {"enabled": ["calculator", "x" * 65]}})
    assert _field_of(doc, "json") == "tools.enabled[1]"
    doc = json.dumps({"tools": {"enabled": ["calculator", "bad\nname"]}})
    assert _field_of(doc, "json") == "tools.enabled[1]"


def test_string_fields_and_paths_are_bounded() -> None:
    doc = json.dumps({"task": {"system_prompt": "x" * (64 * 1024 + 1)}})
    assert _field_of(doc, "json") == "task.system_prompt"
    doc = json.dumps({"tools": {"search_corpus": ["/" + "d" * 5000]}})
    assert _field_of(doc, "json") == "tools.search_corpus[0]"


def test_every_maximum_is_documented_with_its_value() -> None:
    from pathlib import Path

    from libra.spec_limits import BUCKET_MAXIMA, MAXIMA

    doc = (Path(__file__).parents[3] / "docs" / "jobspec.md").read_text()
    limits = doc.split("## Limits", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in limits.splitlines() if line.startswith("| `")]
    table = [*MAXIMA.items(), *(("layout.buckets[]." + k, v) for k, v in BUCKET_MAXIMA.items())]
    for path, high in table:
        section, name = path.rsplit(".", 1)
        shown = f"{int(high):,}" if float(high).is_integer() else f"{high:g}"
        assert any(f"| `{section}` |" in row and f"`{name}`" in row
                   and row.rstrip().endswith(f"| {shown} |") for row in rows), path
