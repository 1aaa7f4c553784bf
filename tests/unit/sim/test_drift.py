"""Drift variants (issue 20 item 5, last bullet): lengths grow 2-3x over the run; bad
parameters are clear errors; the planner's twin follows the growth."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scheduling.planner import Plan, TrainParallelism
from sim.generators import DRIFT_VARIANTS, GeneratorConfig, generate, workload_config
from sim.paper import run_paper
from sim.presets import cluster
from sim.systems import system
from sim.twin import TwinRefiner


def _mean_post_tokens(trace, steps) -> float:
    sel = [t.post_prompt_tokens for t in trace if t.step in steps]
    return sum(sel) / len(sel)


@pytest.mark.parametrize("name", sorted(DRIFT_VARIANTS))
def test_drift_variants_grow_two_to_three_fold(name: str) -> None:
    trace = generate(workload_config(name, num_steps=20, prompts_per_step=16, seed=0))
    growth = _mean_post_tokens(trace, {18, 19}) / _mean_post_tokens(trace, {0, 1})
    assert 1.9 <= growth <= 3.0
    config = workload_config(name, num_steps=20)
    assert config.drift(0) == 1.0
    assert config.drift(19) == pytest.approx(DRIFT_VARIANTS[name][1])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"length_growth": 0.5}, "length_growth must be a number in \\[1, 8\\]"),
        ({"length_growth": 9.0}, "length_growth must be a number in \\[1, 8\\]"),
        ({"length_growth": math.nan}, "length_growth must be"),
        ({"length_growth": True}, "length_growth must be"),
        ({"length_growth": "2"}, "length_growth must be"),
        ({"length_growth": 2.0, "num_steps": 1}, "needs num_steps >= 2"),
    ],
)
def test_impossible_drift_is_a_clear_error(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GeneratorConfig(shape="math", **fields)


def test_unknown_workload_names_shapes_and_variants() -> None:
    with pytest.raises(ValueError, match="unknown workload 'r2e-shrink'.*drift variants"):
        workload_config("r2e-shrink")
    with pytest.raises(ValueError, match="unknown workload 'bogus'"):
        run_paper(shapes=("bogus",))


def test_twin_follows_the_drift() -> None:
    spec = cluster("a800x48")
    trace = generate(workload_config("math-drift", num_steps=20, prompts_per_step=16, seed=1))
    plan = Plan(TrainParallelism(8, 1, 4), ((2, 2, 2, 2),) * 2)
    # Lengths grew ~2x between the two windows; the step time the twin predicts rises
    # with them (less than 2x: the critical path and the training step grow less; less
    # again when streaming, where a step no longer waits for its own stragglers).
    for conf, rise in ((replace(system("libra"), consumption="barrier"), 1.25),
                       (system("libra"), 1.1)):
        early, late = TwinRefiner(spec, conf), TwinRefiner(spec, conf)
        for step in range(5):
            early.observe_step([t for t in trace if t.step == step])
            late.observe_step([t for t in trace if t.step == 15 + step])
        assert late.rollout_s(plan, None) > rise * early.rollout_s(plan, None)
