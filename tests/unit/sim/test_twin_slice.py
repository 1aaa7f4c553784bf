"""The planner twin on a slice of a large fleet (issue 20, session 19): what a slice
keeps (every k-th group longest first, each pattern's share of nodes, the full training
time) and when a twin slices."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libra.errors import InvalidArgument
from scheduling.planner import Plan, TrainParallelism, Workload, train_step_s
from sim.engine import Simulator
from sim.generators import GeneratorConfig, generate
from sim.presets import cluster
from sim.systems import system
from sim.trace import TraceTrajectory
from sim.trainer import SimTrainer
from sim.twin import TwinRefiner
from sim.twin_slice import (
    MIN_SLICE_GROUPS,
    TWIN_SLICE_NODES,
    sample_step,
    slice_factor,
    sliced_run,
)

SPEC = cluster("a800x48")


def _steps(prompts: int, num_steps: int = 5, shape: str = "search") -> list[list[TraceTrajectory]]:
    trace = generate(GeneratorConfig(shape=shape, num_steps=num_steps,
                                     prompts_per_step=prompts, seed=0))
    return [[t for t in trace if t.step == s] for s in range(num_steps)]


def test_a_sample_keeps_every_kth_group_longest_first_with_whole_groups() -> None:
    step = _steps(64, 1)[0]
    kept = sample_step(step, 4)
    longest = {}
    for t in step:
        longest[t.group_id] = max(longest.get(t.group_id, 0), t.total_tokens)
    order = sorted(longest, key=lambda g: (-longest[g], g))
    assert {t.group_id for t in kept} == set(order[::4])
    assert len(kept) == len(step) // 4  # whole groups of 4
    assert max(t.total_tokens for t in kept) == max(t.total_tokens for t in step)
    assert [t for t in step if t in kept] == list(kept)  # trace order kept
    assert sample_step(step, 1) == tuple(step)


def test_a_slice_divides_each_patterns_nodes_and_keeps_the_training_group() -> None:
    big = cluster("h100x1000")
    plan = Plan(TrainParallelism(8, 1, 14), ((8,),) * 83 + ((4, 4),) * 28)
    small_cluster, small = sliced_run(big, plan, 4)
    assert small.train == plan.train
    assert small.rollout_nodes == ((8,),) * 21 + ((4, 4),) * 7
    assert small_cluster.num_nodes == 14 + 28 and small_cluster.hardware == big.hardware
    # A pattern with fewer nodes than the factor keeps one.
    few = Plan(TrainParallelism(8, 1, 14), ((8,),) * 110 + ((2, 2, 4),))
    assert sliced_run(big, few, 4)[1].rollout_nodes.count((2, 2, 4)) == 1
    assert sliced_run(big, plan, 1) == (big, plan)


def test_the_slice_factor_is_bounded_by_nodes_and_by_groups() -> None:
    steps = _steps(320, 1)  # 320 groups a step
    assert slice_factor(125, steps, TWIN_SLICE_NODES) == 125 // TWIN_SLICE_NODES
    assert slice_factor(125, steps, 10) == 12
    assert slice_factor(125, steps, 1) == 320 // MIN_SLICE_GROUPS
    assert slice_factor(SPEC.num_nodes, _steps(16, 1), TWIN_SLICE_NODES) == 1
    assert slice_factor(125, steps, None) == 1
    assert slice_factor(125, [], 1) == 1


def test_a_scaled_trainer_takes_the_whole_steps_time() -> None:
    par = TrainParallelism(8, 1, 2)
    whole = SimTrainer(SPEC.hardware, SPEC.model, 48, 8, colocated=False)
    sliced = SimTrainer(SPEC.hardware, SPEC.model, 48, 8, colocated=False, token_scale=4.0)
    tokens = [3000 + 17 * i for i in range(16)]
    assert sliced.start(0, tokens, par, 0, 0.0) == whole.start(0, tokens * 4, par, 0, 0.0)
    assert whole.log[0]["train_s"] == train_step_s(
        SPEC.hardware, SPEC.model, par, sum(tokens) * 4, sum(tokens) / len(tokens))


def test_a_twin_on_a_large_fleet_runs_a_slice_of_the_work_and_the_nodes() -> None:
    libra = system("libra")
    whole = TwinRefiner(SPEC, libra, slice_nodes=None)
    sliced = TwinRefiner(SPEC, libra, slice_nodes=2)  # 6 nodes: a third
    for batch in _steps(48):  # 48 groups: 3 slices of 16
        whole.observe_step(batch)
        sliced.observe_step(batch)
    assert len(sliced.trace()) * 3 == len(whole.trace())
    assert sliced._run_shape()[3:] == (3, 3.0)
    assert whole._run_shape()[3:] == (1, 1.0)
    plan = Plan(TrainParallelism(8, 1, 2), ((8,),) * 3)
    score = sliced.rollout_s(plan, Workload(4 * 48, ()))
    assert 0 < score < float("inf")
    # Its run trains each batch in the whole step's time on the whole training group.
    small_cluster, small = sliced_run(SPEC, plan, 3)
    raw = Simulator(small_cluster, sliced.trace(), replace(libra, enable_replan=False,
                    enable_elastic=False), small, None, train_token_scale=3.0).run(
                        stop_after_steps=2)
    first = raw["train_log"][0]
    assert first["train_gpus"] == 16
    assert first["trajectories"] * 3 == 4 * 48


@pytest.mark.parametrize("slice_nodes", [0, -3, 1.5, True, "4"])
def test_bad_slice_sizes_are_refused_naming_the_field(slice_nodes: object) -> None:
    with pytest.raises(InvalidArgument, match="slice_nodes"):
        TwinRefiner(SPEC, system("libra"), slice_nodes=slice_nodes)  # type: ignore[arg-type]
