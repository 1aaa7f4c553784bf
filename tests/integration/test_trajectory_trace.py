"""One trace per trajectory, end to end: the in-process loop (the five real cores, one
embedded real Redis, the demo's tiny model on CPU) runs a short C-MLFQ job with every
trajectory traced; the spans go to an in-memory exporter through the OpenTelemetry
adapter, and each trajectory's trace tells its story: the root span from admission to
training (or drop), placement, each turn's generation, tool calls, the scheduler's
decisions and moves, publish, and the training step linked both ways.

The traceparent crosses the services the way it does between processes: in the
trajectory record, through Redis (inboxes, handoffs, the trajectory stream).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from libra import types as t
from libra.jobspec import job_spec_from_json
from libra_cli.inprocess_loop import in_process_stack
from tests.integration.stack_helpers import migrating_cmlfq_job, wait_for_job

pytestmark = pytest.mark.integration

NUM_STEPS = 4


def traced_cmlfq_job() -> str:
    """The migration test's job (stack_helpers.migrating_cmlfq_job), every trajectory
    traced."""
    spec = json.loads(migrating_cmlfq_job(NUM_STEPS))
    spec["observability"] = {"trace_sample_ratio": 1.0}
    return json.dumps(spec)


def by_trace(spans: tuple[ReadableSpan, ...]) -> dict[int, list[ReadableSpan]]:
    traces: dict[int, list[ReadableSpan]] = defaultdict(list)
    for span in spans:
        traces[span.context.trace_id].append(span)
    return traces


async def test_each_trajectory_trace_tells_its_story(spans: InMemorySpanExporter,
                                                     tmp_path: Path) -> None:
    spec_json = traced_cmlfq_job()
    async with in_process_stack(tmp_path, job_spec_from_json(spec_json)) as inproc:
        job = await inproc.coordinator.create_job(spec_json, "json")
        job, _steps, counters = await wait_for_job(inproc.coordinator, job.job_id)
    assert job.state is t.JobState.SUCCEEDED, job.message
    assert counters["migrations"] >= 1, counters
    traces = by_trace(spans.get_finished_spans())
    steps = {s.context.span_id: s for s in spans.get_finished_spans()
             if s.name == "trainer.step"}
    assert len(steps) == NUM_STEPS
    roots = {tid: [s for s in ss if s.name == "trajectory"] for tid, ss in traces.items()}
    ended = {tid: found[0] for tid, found in roots.items() if found}
    # Every trajectory trained or dropped ended its trace exactly once.
    consumed = sum(counters.get(k, 0) for k in ("trained", "dropped_stale", "dropped_failed"))
    assert len(ended) == consumed
    assert all(len(found) <= 1 for found in roots.values())
    trained = [tid for tid, root in ended.items() if root.attributes["libra.outcome"] == "trained"]
    assert len(trained) == counters["trained"]
    for tid in trained:
        check_trained_trace(traces[tid], ended[tid], steps)
    story = [tid for tid, root in ended.items()
             if {"tool.call", "scheduler.decision", "rollout.move"}
             <= {s.name for s in traces[tid]}]
    assert story, "no ended trajectory called a tool and moved"
    check_move(traces[story[0]], ended[story[0]])


def check_trained_trace(trace: list[ReadableSpan], root: ReadableSpan,
                        steps: dict[int, ReadableSpan]) -> None:
    """Root from admission to training; every other span its child; placed, generated,
    published and trained, the train span and the root linked to a step that links back."""
    names = [s.name for s in trace]
    assert {"scheduler.place", "rollout.generate", "rollout.publish", "trainer.train"} <= set(names)
    assert names.count("trainer.train") == 1 and names.count("rollout.publish") == 1
    assert root.parent is None
    for span in trace:
        if span is not root:
            assert span.parent is not None and span.parent.span_id == root.context.span_id
            assert root.start_time <= span.start_time <= span.end_time <= root.end_time, span.name
    for gen in (s for s in trace if s.name == "rollout.generate"):
        assert gen.attributes["libra.bucket"] in ("short", "long")
        assert gen.attributes["libra.batch_size"] >= 1
        assert gen.attributes["libra.policy_version"] >= 0
    train = next(s for s in trace if s.name == "trainer.train")
    (link,) = train.links
    step = steps[link.context.span_id]
    assert root.context.span_id in {lk.context.span_id for lk in step.links}
    assert [lk.context.span_id for lk in root.links] == [step.context.span_id]
    # A turn interrupted (new weights, a move) is generated in parts; a turn cut off
    # with no room left ends without another engine call.
    finished_turns = [s for s in trace if s.name == "rollout.generate"
                      and s.attributes["libra.finish_reason"] != "aborted"]
    assert 1 <= len(finished_turns) <= root.attributes["libra.num_turns"]


def check_move(trace: list[ReadableSpan], root: ReadableSpan) -> None:
    """A tool call with its causal signal, the decision that said MOVE and the move."""
    tool = next(s for s in trace if s.name == "tool.call")
    assert tool.attributes["libra.tool"] == "calculator"
    assert tool.attributes["libra.status"] in ("success", "failure", "timeout")
    assert tool.attributes["libra.size_class"] in ("small", "medium", "large")
    assert tool.attributes["libra.retries"] == 0
    move = next(s for s in trace if s.name == "rollout.move")
    assert (move.attributes["libra.from_bucket"], move.attributes["libra.to_bucket"]) == (
        "short", "long")
    assert move.attributes["libra.reason"]
    decision = next(s for s in trace if s.name == "scheduler.decision"
                    and s.attributes["libra.action"] == "move")
    assert decision.attributes["libra.to_bucket"] == "long"
    assert decision.end_time <= move.start_time
    assert root.attributes["libra.num_migrations"] >= 1
    assert {s.attributes["libra.bucket"] for s in trace if s.name == "rollout.generate"
            } == {"short", "long"}
