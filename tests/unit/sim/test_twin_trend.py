"""The planner twin replays the recent complete steps scaled by the length trend
(issue 20, session 14 lever 2)."""

from __future__ import annotations

import math

import pytest

from libra.errors import InvalidArgument
from sim.engine import Simulator
from sim.generators import GeneratorConfig, generate
from sim.presets import cluster
from sim.run import initial_plan
from sim.systems import system
from sim.trace import TraceTrajectory, Turn
from sim.twin import MIN_TREND_STEPS, TwinRefiner

SPEC = cluster("a800x48")


def _step(step: int, out_tokens: int, n: int = 4) -> list[TraceTrajectory]:
    return [
        TraceTrajectory(f"s{step}-{i}", f"p{i}", f"{step}:p{i}", step, 100, (Turn(out_tokens),))
        for i in range(n)
    ]


def _twin(trend: bool = True) -> TwinRefiner:
    return TwinRefiner(SPEC, system("libra"), trend=trend)


def test_geometric_growth_is_extrapolated_to_the_newest_released_step() -> None:
    twin = _twin()
    for step in range(6):
        twin.observe_step(_step(step, 1000 * 2**step))
    twin.observe_release(9)
    # Replayed: the last 5 complete steps (1..5, centre 3); 9 is 6 steps ahead.
    assert twin.length_scale() == pytest.approx(2.0**6, rel=1e-3)


def test_no_trend_without_enough_steps_a_frontier_or_the_option() -> None:
    twin = _twin()
    for step in range(MIN_TREND_STEPS - 1):
        twin.observe_step(_step(step, 1000 * 2**step))
    twin.observe_release(5)
    assert twin.length_scale() == 1.0  # too few complete steps
    twin.observe_step(_step(MIN_TREND_STEPS - 1, 1000 * 2 ** (MIN_TREND_STEPS - 1)))
    assert twin.length_scale() > 1.0
    fresh = _twin()
    for step in range(4):
        fresh.observe_step(_step(step, 1000 * 2**step))
    assert fresh.length_scale() == 1.0  # no released step known yet
    off = _twin(trend=False)
    for step in range(4):
        off.observe_step(_step(step, 1000 * 2**step))
    off.observe_release(9)
    assert off.length_scale() == 1.0
    assert [t.turns for t in off.trace()[:4]] == [t.turns for t in _step(0, 1000)]


def test_scaled_replay_never_grows_past_the_longest_trajectory_seen() -> None:
    twin = _twin()
    for step in range(4):
        twin.observe_step(_step(step, 1000 * 2**step))
    twin.observe_release(20)
    assert twin.length_scale() > 100
    longest = 100 + 8000
    assert all(t.total_tokens <= longest for t in twin.trace())
    assert max(t.total_tokens for t in twin.trace()) == longest


def test_shrinking_lengths_scale_down() -> None:
    twin = _twin()
    for step in range(4):
        twin.observe_step(_step(step, 8000 // 2**step))
    twin.observe_release(4)
    # Replayed steps 0..3 (centre 1.5), target 4: halving per step.
    assert twin.length_scale() == pytest.approx(0.5**2.5, rel=1e-3)
    assert all(t.output_tokens < 8000 for t in twin.trace())


def test_the_next_step_replaces_the_startup_profile() -> None:
    twin = _twin()
    twin.observe_step(_step(0, 500, n=2), provisional=True)
    twin.observe_step(_step(0, 700, n=4))
    twin.observe_step(_step(1, 700))
    assert len(twin.trace()) == twin._steps * 4  # two steps of 4, no profile left
    assert math.isclose(twin.length_scale(), 1.0)
    # Without the flag, batches that start at the same step are all kept (a caller
    # feeding consumed batches, as the twin before session 14 was fed).
    kept = _twin()
    kept.observe_step(_step(0, 500, n=2))
    kept.observe_step(_step(0, 700, n=4))
    assert len(kept.trace()) == sum((2, 4)[step % 2] for step in range(kept._steps))


def test_the_run_feeds_the_twin_only_complete_release_steps() -> None:
    trace = generate(GeneratorConfig(shape="math", num_steps=8, prompts_per_step=8, seed=5))
    conf = system("libra")
    plan, planner, _, twin = initial_plan(SPEC, trace, conf)
    seen: list[list[TraceTrajectory]] = []
    original = twin.observe_step
    twin.observe_step = lambda ts: (seen.append(list(ts)), original(ts))[1]  # type: ignore[method-assign]
    sim = Simulator(SPEC, trace, conf, plan, planner, twin=twin)
    sim.run()
    sizes = {s: sum(1 for t in trace if t.step == s) for s in range(8)}
    assert seen, "the planner ran and fed its twin"
    assert [ts[0].step for ts in seen] == list(range(len(seen)))  # in release order
    assert all(len(ts) == sizes[ts[0].step] for ts in seen)  # whole steps
    assert all(len({t.step for t in ts}) == 1 for ts in seen)
    assert sim.twin_fed_steps == len(seen)


@pytest.mark.parametrize("trend", [1, "yes", None])
def test_a_trend_that_is_not_a_bool_names_the_field(trend: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        TwinRefiner(SPEC, system("libra"), trend=trend)  # type: ignore[arg-type]
    assert err.value.field == "trend"
