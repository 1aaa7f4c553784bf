"""The run view (/ui and `libra top`): built from stored records, as plain JSON (pure)."""

from __future__ import annotations

import json

from libra import types as t
from libra.run_view import MAX_CURVE_POINTS, MAX_EVENTS, build_run_view, run_view_to_dict


def make_job(job_id: str = "job-a", state: t.JobState = t.JobState.RUNNING, *,
             num_steps: int = 10, queue_position: int = 0, created_at_ms: int = 1,
             step: int = 0) -> t.Job:
    spec = {"algorithm": {"num_steps": num_steps}}
    return t.Job(job_id=job_id, name=job_id.split("-")[0], state=state,
                 spec_json=json.dumps(spec), created_at_ms=created_at_ms, updated_at_ms=1,
                 step=step, queue_position=queue_position)


def make_step(n: int, **fields: object) -> dict[str, object]:
    return {"step": n, "reward_mean": n / 100, "rollout_s": 1.0, "train_s": 0.5,
            "wall_s": 2.0, "num_trajectories": 4, "tokens_mean": 50.0, **fields}


def view_of(steps=(), counters=None, events=(), leases=(), jobs=(), job=None):
    job = job or make_job()
    return build_run_view(job, list(steps), counters or {}, list(events), list(leases),
                          list(jobs) or [job])


def test_an_empty_job_has_an_empty_view_with_an_unknown_verdict() -> None:
    view = view_of()
    assert (view.curve, view.phases, view.buckets, view.reward_last) == ([], [], [], None)
    assert view.verdict.kind == "unknown" and view.job.target_steps == 10


def test_curve_phases_and_throughput_come_from_the_steps() -> None:
    view = view_of([make_step(1), make_step(2, publish_s=0.5)])
    assert [(p.step, p.reward_mean) for p in view.curve] == [(1, 0.01), (2, 0.02)]
    assert view.reward_last == 0.02
    phases = {p.phase: (p.mean_s, p.share) for p in view.phases}
    assert list(phases) == ["rollout_wait", "recompute", "train", "publish", "reload"]
    assert phases["rollout_wait"] == (1.0, 0.5) and phases["publish"] == (0.25, 0.125)
    # 8 trajectories of 50 tokens in 4 s of steps.
    assert (view.throughput.trajectories_per_s, view.throughput.tokens_per_s,
            view.throughput.step_wall_s) == (2.0, 100.0, 2.0)


def test_a_long_curve_is_thinned_keeping_the_newest_point() -> None:
    steps = [{"step": n, "reward_mean": 0.5} for n in range(1, 2 * MAX_CURVE_POINTS + 8)]
    curve = view_of(steps).curve
    assert len(curve) <= MAX_CURVE_POINTS
    assert curve[-1].step == len(steps)
    assert [p.step for p in curve] == sorted(p.step for p in curve)


def test_buckets_sum_placements_and_show_the_last_step() -> None:
    view = view_of([make_step(1, bucket_occupancy={"short": 3, "long": 1}, migrations=2),
                    make_step(2, bucket_occupancy={"short": 4}, migrations=1)])
    assert [(b.bucket, b.placed_total, b.placed_last_step, b.share) for b in view.buckets] == [
        ("long", 1, 0, 0.125), ("short", 7, 4, 0.875)]
    assert (view.migrations_total, view.migrations_last_step) == (3, 1)


def test_counters_use_the_measured_backlog_when_there_is_one() -> None:
    counters = {"produced": 10, "failed": 2, "trained": 8, "dropped_stale": 1,
                "requeued": 3}
    assert view_of(counters=counters).counters.in_flight == 3  # derived: 12 - 9
    measured = view_of(counters={**counters, "in_flight_unconsumed": 2}).counters
    assert (measured.produced, measured.in_flight, measured.requeued) == (12, 2, 3)


def test_eval_rounds_become_points_and_the_later_copy_of_a_round_wins() -> None:
    def eval_event(rnd: int, step: int, reward: float) -> dict[str, object]:
        record = {"eval_round": rnd, "step": step, "reward_mean": reward, "accuracy": 0.5}
        return {"kind": "eval", "ts_ms": 5, "record": json.dumps(record)}

    view = view_of(events=[eval_event(1, 4, 0.2), eval_event(0, 0, 0.1),
                           eval_event(1, 4, 0.3)])
    assert [(e.step, e.reward_mean) for e in view.evals] == [(0, 0.1), (4, 0.3)]
    assert view.events == []  # eval rounds are the curve's, not the event list's


def test_events_are_the_newest_with_their_details() -> None:
    events = [{"kind": "plan" if i % 2 else "join", "ts_ms": i, "step": i, "worker_id": "",
               "epoch": 0, "wanted": i} for i in range(MAX_EVENTS + 5)]
    events.append({"kind": "trainer_resumed", "ts_ms": 99, "step": "7", "id": "1-0"})
    events.append({"kind": "odd", "ts_ms": 100, "step": "not a number"})
    view = view_of(events=events)
    assert len(view.events) == MAX_EVENTS
    assert view.events[-2].step == 7 and view.events[-1].step == 0
    assert "wanted=" in view.events[0].detail and "epoch" not in view.events[0].detail


def test_a_run_of_events_of_one_kind_is_one_line_with_its_count() -> None:
    reloads = [{"kind": "weights_loaded", "ts_ms": i, "instance": f"rollout-{i % 2}"}
               for i in range(40)]
    plan = {"kind": "plan", "ts_ms": 50, "step": 3, "wanted": 1}
    view = view_of(events=[plan, *reloads, plan])
    assert [(e.kind, e.count) for e in view.events] == [
        ("plan", 1), ("weights_loaded", 40), ("plan", 1)]
    assert view.events[1].ts_ms == 39 and "rollout-1" in view.events[1].detail


def test_the_queue_lists_the_running_job_first_then_the_queue_in_order() -> None:
    running = make_job("run-1", created_at_ms=5)
    queued = [make_job("q-2", t.JobState.PENDING, queue_position=2, created_at_ms=1),
              make_job("q-1", t.JobState.PENDING, queue_position=1, created_at_ms=9)]
    done = make_job("old-1", t.JobState.SUCCEEDED)
    view = view_of(job=running, jobs=[done, *queued, running])
    assert [q.job_id for q in view.queue] == ["run-1", "q-1", "q-2"]


def test_workers_come_from_the_leases_sorted_and_hybrid_counts_from_the_last_step() -> None:
    leases = [t.Lease(worker_id=w, role=t.WorkerRole(role), bucket="short", address="a",
                      epoch=3, expires_at_ms=0, ttl_ms=1000)
              for w, role in (("rollout-1", "hybrid-rollout"), ("rollout-0", "core-rollout"))]
    view = view_of([make_step(1, hybrid_workers=1, hybrid_joining=1)], leases=leases)
    assert [(w.worker_id, w.role) for w in view.workers] == [
        ("rollout-0", "core-rollout"), ("rollout-1", "hybrid-rollout")]
    assert (view.hybrid_training, view.hybrid_joining) == (1, 1)


def test_the_view_is_plain_json() -> None:
    view = view_of([make_step(1, bucket_occupancy={"short": 1})])
    data = json.loads(json.dumps(run_view_to_dict(view)))
    assert data["job"]["job_id"] == "job-a" and data["verdict"]["kind"] == "rollout-bound"
    assert set(data) >= {"queue", "counters", "curve", "evals", "phases", "throughput",
                         "buckets", "workers", "events", "verdict"}


def test_a_stored_record_decodes_the_same_without_the_recheck() -> None:
    """The view skips the codec's checks on stored records (checked when reported);
    the record it gets is the one the full decode gives."""
    from libra.wire.step_record import step_record_from_dict

    stored = make_step(3, bucket_occupancy={"short": 2}, reward_components={"f": 0.5},
                       loss=0.25, recompute_s=0.1)
    assert step_record_from_dict(stored, is_checked=True) == step_record_from_dict(stored)
