"""GRPO group completeness under streaming (issue 20, session 14 lever 1): a group is
trainable when its last member finishes; staleness is its oldest member's."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from libra.errors import InvalidArgument
from sim import bounds
from sim.engine import Simulator
from sim.generators import GeneratorConfig, generate
from sim.presets import cluster
from sim.run import initial_plan, run
from sim.state import TrajState
from sim.systems import system
from sim.trainer import BatchSource

SPEC = cluster("a800x48")
# 2 steps x 2 prompts x 4 samples: two groups of four per step.
TRACE = generate(GeneratorConfig(shape="math", num_steps=2, prompts_per_step=2, seed=0))


def _states() -> dict[int, list[TrajState]]:
    by_step: dict[int, list[TrajState]] = {}
    for i, rec in enumerate(TRACE):
        by_step.setdefault(rec.step, []).append(TrajState(rec, i))
    return by_step


def _groups(by_step: dict[int, list[TrajState]], step: int) -> list[list[TrajState]]:
    out: dict[str, list[TrajState]] = {}
    for t in by_step[step]:
        out.setdefault(t.rec.group_id, []).append(t)
    return list(out.values())


def test_stream_takes_whole_groups_once_their_last_member_finishes() -> None:
    by_step = _states()
    src = BatchSource("stream", by_step, unit="group")
    src.on_release(0, 0)
    src.on_release(1, 0)
    a, b = _groups(by_step, 0)
    c, d = _groups(by_step, 1)
    # Three members of each of a, b, c finish, then all of d: only d is complete.
    for t in a[:3] + b[:3] + c[:3] + d:
        src.on_finish(t)
    assert src.take(0, complete=False, version=0) is None  # one complete group of two
    src.on_finish(a[3])
    batch = src.take(0, complete=False, version=0)
    assert batch == d + a  # whole groups, in the order their last member finished
    per_traj = BatchSource("stream", by_step, unit="trajectory")
    per_traj.on_release(0, 0)
    per_traj.on_release(1, 0)
    for t in a[:3] + b[:3] + c[:3] + d:
        per_traj.on_finish(t)
    assert len(per_traj.take(0, complete=False, version=0)) == len(by_step[0])


def test_bounded_waits_for_a_due_group_with_a_member_still_generating() -> None:
    by_step = _states()
    src = BatchSource("bounded", by_step, unit="group")
    (a, b), (c, d) = _groups(by_step, 0), _groups(by_step, 1)
    for t in a + b:
        t.first_version = 0
    for t in c + d:
        t.first_version = 2
    # At version 4 with bound 4, version 0 is due: a member of b is still generating.
    for t in a + b[:3] + c + d:
        src.on_finish(t)
    assert src.take(0, False, 4, in_flight=[0], max_staleness=4) is None
    # The in-flight list alone would not show it once that member finished elsewhere:
    # the held members of the incomplete group carry the group's version.
    assert src.take(0, False, 4, in_flight=[], max_staleness=4) is None
    src.on_finish(b[3])
    batch = src.take(0, False, 4, in_flight=[], max_staleness=4)
    assert Counter(t.rec.group_id for t in batch) == Counter(
        {a[0].rec.group_id: 4, b[0].rec.group_id: 4}
    )
    assert src.staleness == [4] * 8


@pytest.mark.parametrize("unit", ["groups", "", None, 1])
def test_unknown_unit_names_the_field(unit: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        BatchSource("stream", _states(), unit=unit)  # type: ignore[arg-type]
    assert err.value.field == "consume_unit"
    with pytest.raises(InvalidArgument) as err:
        replace(system("stream-lb"), consume_unit=unit)
    assert err.value.field == "consume_unit"


@pytest.mark.parametrize("name", ["stream-lb", "stream-lb-unbounded", "libra"])
def test_streaming_systems_train_only_whole_groups(name: str) -> None:
    trace = generate(GeneratorConfig(shape="r2e", num_steps=8, prompts_per_step=8, seed=3))
    conf = system(name)
    if conf.train_gpus is None and not conf.enable_replan:
        conf = conf.with_split(32, conf.node_patterns[0], "reference")
    assert conf.consume_unit == "group"
    plan, planner, _, twin = initial_plan(SPEC, trace, conf)
    sim = Simulator(SPEC, trace, conf, plan, planner, twin=twin)
    sim.run()
    sizes = Counter(t.group_id for t in trace)
    for batch in sim.consumed.values():
        got = Counter(t.rec.group_id for t in batch)
        assert got == {g: sizes[g] for g in got}  # every group whole, in one batch
    if conf.consumption == "bounded":
        assert max(sim.batches.staleness) <= conf.staleness


def test_group_unit_only_tightens_the_streaming_chain_bound() -> None:
    trace = generate(GeneratorConfig(shape="math", num_steps=4, prompts_per_step=4, seed=1))
    per_traj = bounds.lower_bound_s(SPEC, trace, 4, stream=True)
    per_group = bounds.lower_bound_s(SPEC, trace, 4, stream=True, group=True)
    barrier = bounds.lower_bound_s(SPEC, trace, 4)
    assert per_traj["step_chain_bound_s"] < per_group["step_chain_bound_s"]
    assert per_group["step_chain_bound_s"] <= barrier["step_chain_bound_s"]


def test_the_barrier_is_unchanged_by_the_unit() -> None:
    trace = generate(GeneratorConfig(shape="math", num_steps=6, prompts_per_step=4, seed=2))
    conf = system("async-lb").with_split(32, (2, 2, 2, 2), "reference")
    a = run(SPEC, trace, conf)
    b = run(SPEC, trace, replace(conf, consume_unit="trajectory"))
    assert a["makespan_s"] == b["makespan_s"]
