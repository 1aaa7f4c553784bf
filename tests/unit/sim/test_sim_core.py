"""Cluster simulator: traces, KV limit, bounds, systems as configs, determinism, recorder."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from libra import types as t
from libra_cli import sim_record as record
from sim import bounds, presets, trace
from sim.engine import Simulator
from sim.generators import GeneratorConfig, generate
from sim.instance import Instance, Seq
from sim.run import initial_plan, run
from sim.systems import SYSTEM_NAMES, SYSTEMS, system

CLUSTER = presets.cluster("a800x16")


def _trace(shape: str = "r2e", steps: int = 3, prompts: int = 4, seed: int = 0):
    return generate(
        GeneratorConfig(shape=shape, num_steps=steps, prompts_per_step=prompts, seed=seed)
    )


def _line(**over) -> str:
    obj = {
        "prompt_id": "p",
        "step": 0,
        "prompt_tokens": 10,
        "turns": [
            {
                "output_tokens": 5,
                "tool": {"type": "x", "payload_tokens": 3, "status": "success", "latency_s": 1.0},
            },
            {"output_tokens": 2},
        ],
    }
    obj.update(over)
    return json.dumps(obj)


# Trace format.


def test_trace_round_trip(tmp_path) -> None:
    tr = _trace()
    trace.dump(tr, tmp_path / "t.jsonl")
    assert trace.load(tmp_path / "t.jsonl") == tr


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("{not json", "<json>"),
        (_line(prompt_id=3), "prompt_id"),
        (_line(step=-1), "step"),
        (_line(turns=[]), "turns"),
        (_line(turns=[{"output_tokens": 5}, {"output_tokens": 2}]), "turns[0].tool"),
        (
            _line(
                turns=[
                    {
                        "output_tokens": 5,
                        "tool": {"type": "x", "payload_tokens": 3, "status": "ok", "latency_s": 1},
                    },
                    {"output_tokens": 1},
                ]
            ),
            "turns[0].tool.status",
        ),
    ],
)
def test_malformed_line_names_line_number_and_field(text: str, field: str) -> None:
    with pytest.raises(trace.TraceError) as err:
        list(trace.parse_lines([_line(), "", text]))
    assert err.value.line_no == 3 and err.value.field == field
    assert "line 3" in str(err.value)


def test_unknown_presets_raise_value_error() -> None:
    with pytest.raises(ValueError, match="cluster preset"):
        presets.cluster("tpu9000")
    with pytest.raises(ValueError, match="hardware preset"):
        presets.cluster("b200x8")
    with pytest.raises(ValueError, match="unknown system"):
        system("verl")


# Instance mechanics.


def test_instance_never_exceeds_kv_capacity_and_queues_the_rest() -> None:
    inst = Instance.create("i", 1, "tp1", 0, CLUSTER.hardware, CLUSTER.model)
    big = inst.kv_capacity // 3
    for _ in range(5):
        inst.waiting.append(Seq(None, 10, 10, 0, big))
    inst.admit_waiting()
    assert len(inst.running) == 3 and len(inst.waiting) == 2
    assert inst.kv_reserved <= inst.kv_capacity


def test_segment_ends_at_first_completion_and_time_is_monotone() -> None:
    inst = Instance.create("i", 2, "tp2", 0, CLUSTER.hardware, CLUSTER.model)
    inst.waiting.extend([Seq("a", 0, 5, 100, 200), Seq("b", 0, 9, 100, 200)])
    inst.admit_waiting()
    end = inst.plan_segment(0.0)
    assert inst.seg_steps == 5 and end > 0
    assert [inst.seg_elapsed(k) for k in range(6)] == sorted(inst.seg_elapsed(k) for k in range(6))
    done = inst.advance(inst.seg_steps)
    (left,) = inst.running.values()
    assert [s.traj for s in done] == ["a"] and done[0].decode_left == 0
    assert inst.decode_left(left) == 4 and inst.ctx_of(left) == 105
    assert inst.seg_start == pytest.approx(end)


def test_a_turn_finishing_its_prefill_decodes_from_the_next_segment() -> None:
    inst = Instance.create("i", 1, "tp1", 0, CLUSTER.hardware, CLUSTER.model)
    a, b, c = Seq("a", 0, 3, 100, 200), Seq("b", 10, 5, 0, 200), Seq("c", 0, 3, 50, 200)
    inst.waiting.extend([a, b, c])
    inst.admit_waiting()
    inst.plan_segment(0.0)
    assert inst.seg_steps == 1  # b's prefill fits one chunk
    assert inst.advance(1) == [] and b.prefill_left == 0
    assert [inst.decode_left(s) for s in (a, b, c)] == [2, 5, 2]
    inst.plan_segment(inst.seg_start)
    assert inst.seg_steps == 2
    assert [s.traj for s in inst.advance(2)] == ["a", "c"]  # admission order
    assert inst.decode_left(b) == 3 and inst.ctx_of(b) == 12
    assert inst.kv_reserved == 200


# Whole runs.


def test_every_system_runs_and_lower_bound_holds() -> None:
    tr = _trace()
    for name in SYSTEM_NAMES:
        res = run(CLUSTER, tr, system(name))
        assert res["feasible"], res
        assert res["lower_bound_s"] <= res["makespan_s"]
        assert 0 < res["gpu_busy_fraction"] <= 1.0
        assert res["max_kv_fraction"] <= 1.0


def test_systems_differ_only_in_configuration() -> None:
    names = {f.name for f in fields(SYSTEMS["libra"])}
    for name, conf in SYSTEMS.items():
        assert {f.name for f in fields(conf)} == names and conf.name == name
    # Every system is driven by the project's real policies.
    from scheduling.policy import POLICY_NAMES

    assert {c.policy for c in SYSTEMS.values()} <= set(POLICY_NAMES)


def test_events_are_processed_in_time_order() -> None:
    tr = _trace(steps=2)
    plan, planner, _, _ = initial_plan(CLUSTER, tr, system("async-lb"))
    sim = Simulator(CLUSTER, tr, system("async-lb"), plan, planner)
    seen: list[float] = []
    original = sim._on_tool

    def spy(traj, now):
        seen.append(now)
        original(traj, now)

    sim._on_tool = spy
    sim.run()
    assert seen == sorted(seen) and seen


def test_same_seed_same_result_different_seed_differs() -> None:
    a = run(CLUSTER, _trace(seed=1), system("libra"))
    b = run(CLUSTER, _trace(seed=1), system("libra"))
    c = run(CLUSTER, _trace(seed=2), system("libra"))
    strip = lambda r: {k: v for k, v in r.items() if k != "sim_wall_s"}  # noqa: E731
    assert strip(a) == strip(b) and a["makespan_s"] != c["makespan_s"]


def test_trace_longer_than_largest_kv_is_reported_infeasible() -> None:
    huge = trace.TraceTrajectory("t", "p", "g", 0, 10, (trace.Turn(5_000_000),))
    res = run(CLUSTER, [huge], system("libra"))
    assert res["feasible"] is False and "KV" in res["reason"]


def test_bound_terms_are_positive() -> None:
    b = bounds.lower_bound_s(CLUSTER, _trace(steps=1))
    assert b["lower_bound_s"] == max(
        b["work_bound_s"], b["step_chain_bound_s"], b["throughput_chain_bound_s"]
    ) > 0
    assert b["step_chain_bound_s"] >= b["critical_path_s"]


# Recorder.


def test_recorder_converts_a_trajectory_by_loss_mask() -> None:
    traj = t.Trajectory(
        trajectory_id="t1",
        job_id="j",
        group_id="g",
        prompt_id="p",
        prompt_text="",
        reference="",
        status=t.TrajectoryStatus.FINISHED,
    )
    traj.num_prompt_tokens = 4
    traj.token_ids = list(range(4 + 6 + 3 + 2))
    traj.loss_mask = [0] * 4 + [1] * 6 + [0] * 3 + [1] * 2
    traj.token_versions = [0] * 4 + [2] * 6 + [0] * 3 + [2] * 2
    traj.tool_states = [t.ToolReturnState("python", t.SizeClass.SMALL, t.ToolStatus.FAILURE)]
    traj.created_at_ms, traj.finished_at_ms = 0, 10_000
    rec = record.from_trajectory(traj, decode_tokens_per_s=1.0)
    assert rec.step == 2 and rec.prompt_tokens == 4
    assert [tt.output_tokens for tt in rec.turns] == [6, 2]
    assert rec.turns[0].tool == trace.ToolCall("python", 3, "failure", 2.0)
    from libra.wire.common import encode_trajectory

    traj.logprobs = [0.0] * len(traj.token_ids)
    assert (
        record.from_stream_entries([encode_trajectory(traj)])[0].turns[0].tool.payload_tokens == 3
    )
    # The recorded trace parses back through the public format.
    assert trace.parse_line(json.dumps(rec.to_dict()), 1) == rec
