"""The throughput chain bound (issue 20 item 2, session 15): the step chain with the
rollout's work over the devices that can generate; a lower bound no simulated run beats."""

from __future__ import annotations

import pytest

from libra.errors import InvalidArgument
from sim import bounds, presets
from sim.generators import GeneratorConfig, generate, workload_config
from sim.run import max_rollout_gpus, run
from sim.systems import SYSTEM_NAMES, system
from sim.trace import TraceTrajectory, Turn

SMALL = presets.cluster("a800x16")
ONE_NODE = presets.cluster("a800x8")


def _flat_trace(steps: int, per_step: int, prompt: int, out: int) -> list[TraceTrajectory]:
    """Tool-free trajectories, all alike: generation work, not one trajectory, dominates."""
    return [
        TraceTrajectory(f"t{s}-{i}", f"p{i}", f"{s}:p{i}", s, prompt, (Turn(out),))
        for s in range(steps) for i in range(per_step)
    ]


def _sync_chain_by_hand(cluster: presets.ClusterSpec, trace: list[TraceTrajectory]) -> float:
    """Staleness 0: each step's rollout (its longest trajectory or its work over every
    device, whichever is longer), then its training, one after the other."""
    total = 0.0
    for step in sorted({t.step for t in trace}):
        batch = [t for t in trace if t.step == step]
        costs = [bounds.rollout_cost_s(cluster, t) for t in batch]
        work_s = max(sum(c[0] for c in costs), sum(c[1] for c in costs)) / cluster.num_gpus
        longest_s = max(bounds.critical_path_s(cluster, t) for t in batch)
        total += max(longest_s, work_s) + bounds._batch_train_s(cluster, batch)
    return total


@pytest.mark.parametrize(("per_step", "binding"), [(2, "longest"), (400, "work")])
def test_sync_chain_is_each_steps_rollout_then_training(per_step: int, binding: str) -> None:
    trace = _flat_trace(3, per_step, 4000, 1000)
    got = bounds.throughput_chain_bound_s(ONE_NODE, trace, 0, ONE_NODE.num_gpus)
    assert got == pytest.approx(_sync_chain_by_hand(ONE_NODE, trace), rel=1e-12)
    longest = bounds.critical_path_s(ONE_NODE, trace[0])
    costs = [bounds.rollout_cost_s(ONE_NODE, t) for t in trace[:per_step]]
    work = max(sum(c[0] for c in costs), sum(c[1] for c in costs)) / ONE_NODE.num_gpus
    assert (work > longest) == (binding == "work")


def test_fewer_generating_devices_raise_the_bound_and_lower_bound_is_the_largest() -> None:
    trace = _flat_trace(3, 400, 4000, 1000)
    every = bounds.lower_bound_s(SMALL, trace, staleness=4)
    few = bounds.lower_bound_s(SMALL, trace, staleness=4, max_rollout_gpus=2)
    assert few["throughput_chain_bound_s"] > every["throughput_chain_bound_s"]
    assert few["lower_bound_s"] == max(
        few["work_bound_s"], few["step_chain_bound_s"], few["throughput_chain_bound_s"]
    )
    # Generation-bound on two devices: the new bound is the one that binds.
    assert few["lower_bound_s"] == few["throughput_chain_bound_s"] > few["work_bound_s"]
    assert few["throughput_chain_bound_s"] > few["step_chain_bound_s"]


def test_streaming_bound_is_all_work_then_the_cheapest_unit() -> None:
    trace = _flat_trace(2, 8, 100, 50)
    costs = [bounds.rollout_cost_s(SMALL, t) for t in trace]
    work = max(sum(c[0] for c in costs), sum(c[1] for c in costs)) / 8
    longest = max(bounds.critical_path_s(SMALL, t) for t in trace)
    unit = bounds._batch_train_s(SMALL, trace[:1], attention=False)
    got = bounds.throughput_chain_bound_s(SMALL, trace, 4, 8, stream=True)
    assert got == pytest.approx(max(longest, work) + unit, rel=1e-12)


@pytest.mark.parametrize("bad", [0, -8, 17, 2.5, "8", None])
def test_bad_max_rollout_gpus_names_the_field(bad: object) -> None:
    if bad is None:  # None means every device: valid
        bounds.lower_bound_s(SMALL, _flat_trace(1, 1, 10, 5), max_rollout_gpus=bad)
        return
    with pytest.raises(InvalidArgument, match="max_rollout_gpus"):
        bounds.lower_bound_s(SMALL, _flat_trace(1, 1, 10, 5), max_rollout_gpus=bad)  # type: ignore[arg-type]


def test_rollout_devices_of_a_disaggregated_loop_leave_a_training_node() -> None:
    assert max_rollout_gpus(SMALL, system("sync-lb")) == 16
    assert max_rollout_gpus(SMALL, system("libra")) == 8


# No run of any system beats it (every system, shapes and a drift variant, two seeds; and
# a generation-bound workload where the new bound is the binding one).

WORKLOADS = [
    generate(GeneratorConfig(shape=shape, num_steps=4, prompts_per_step=4, seed=seed))
    for shape in ("r2e", "search", "math") for seed in (0, 1)
] + [generate(workload_config("math-drift", num_steps=4, prompts_per_step=4, seed=2))]


@pytest.mark.parametrize("name", SYSTEM_NAMES)
def test_no_simulated_run_beats_the_bound(name: str) -> None:
    for trace in WORKLOADS:
        res = run(SMALL, trace, system(name))
        assert res["feasible"], res
        terms = res["bound_terms"]
        assert terms["throughput_chain_bound_s"] <= res["makespan_s"], (name, terms)
        assert res["lower_bound_s"] <= res["makespan_s"]


@pytest.mark.parametrize("name", ["sync-lb", "async-lb", "stream-lb"])
def test_generation_bound_run_stays_above_a_binding_bound(name: str) -> None:
    trace = _flat_trace(3, 160, 4000, 600)
    res = run(SMALL, trace, system(name))
    terms = res["bound_terms"]
    assert terms["throughput_chain_bound_s"] <= res["makespan_s"]
    if name != "stream-lb":  # streaming's form is weaker than the work bound
        assert terms["throughput_chain_bound_s"] > terms["step_chain_bound_s"]
