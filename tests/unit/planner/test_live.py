"""Live facade: the planner core driven by step records and leases (CPU deployment)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from libra.jobspec import ElasticSpec
from libra.types import Lease, WorkerId, WorkerRole
from scheduling.planner import PlanError
from scheduling.planner.live import (
    LiveConfig,
    LiveCostModel,
    LivePlanner,
    count_roles,
    live_planner,
)


def _leases(training: int = 0, joining: int = 0, hybrid_rollout: int = 3) -> list[dict]:
    """1 core-training, 1 core-rollout, 1 service, and the hybrids by state."""
    roles = (
        ["core-training", "core-rollout", "service"]
        + ["hybrid-training"] * training
        + ["hybrid-joining"] * joining
        + ["hybrid-rollout"] * hybrid_rollout
    )
    return [{"worker_id": f"w{i}", "role": r, "bucket": ""} for i, r in enumerate(roles)]


def _record(step: int, rollout_s: float, train_s: float, **kw) -> dict:
    return {"step": step, "rollout_s": rollout_s, "train_s": train_s,
            "num_trajectories": 8, "tokens_mean": 120.0, "turns_mean": 2.0, **kw}


def _live(**kw) -> LivePlanner:
    base = {"interval_steps": 1000, "warmup_steps": 0, "cooldown_steps": 0,
            "min_history_trajectories": 1, "transition_cost_s": 1.0, "ttl_steps": 3}
    return LivePlanner(LiveConfig(**{**base, **kw}))


def test_sequence_joins_when_training_bound_then_releases_when_rollout_bound() -> None:
    live = _live(min_dwell_steps=0)
    # Trainer waits 1 s for data (4 rollout workers: w_rollout = 4), trains 10 s
    # (w_train = 10): train/rollout = 10 >= 1.15 -> borrow. The model picks 2 of the 3:
    # max(10 / 3, 4 / 2) = 3.3 s beats 1 lent (5 s), 3 lent (4 s) and none (10 s).
    out = live.on_step(_record(1, 1.0, 10.0), _leases())
    assert out["elastic"]["action"] == "join"
    assert (out["elastic"]["desired_hybrids"], out["elastic"]["reason"]) == (2, "borrow")
    # The joins are in flight; ratio 1.0 sits in the band (0.90, 1.15): hold.
    out = live.on_step(_record(2, 5.0, 5.0), _leases(joining=2, hybrid_rollout=1))
    assert (out["elastic"]["action"], out["elastic"]["current_hybrids"]) == ("hold", 2)
    # Now rollout-bound (waits 20 s, trains 2 s): the ratio trigger plans on the fitted
    # w_train = 7.75, w_rollout = 16.06: 1 lent -> max(3.9, 5.4) beats 2 lent (8.0).
    out = live.on_step(_record(3, 20.0, 2.0), _leases(training=2, hybrid_rollout=1))
    assert out["decision"]["fired"] is True
    assert (out["elastic"]["action"], out["elastic"]["desired_hybrids"]) == ("release", 1)


def test_a_move_stands_min_dwell_steps_before_the_next_one() -> None:
    live = _live(min_dwell_steps=5)
    assert live.on_step(_record(1, 1.0, 10.0), _leases())["elastic"]["desired_hybrids"] == 2
    for step in (2, 3, 4, 5):  # rollout-bound at once: the swing back waits
        out = live.on_step(_record(step, 20.0, 2.0), _leases(training=2, hybrid_rollout=1))
        elastic = out["elastic"]
        assert (elastic["action"], elastic["desired_hybrids"]) == ("hold", 2)
        assert elastic["reason"].startswith("dwell:")
    out = live.on_step(_record(6, 20.0, 2.0), _leases(training=2, hybrid_rollout=1))
    assert out["elastic"]["action"] == "release"


def test_no_move_when_the_model_predicts_no_gain() -> None:
    live = _live(min_dwell_steps=0)
    # Train/rollout = 6 / 5 = 1.2 >= 1.15 says borrow, but with w_rollout = 5 s x 4 = 20
    # lending one gives max(6 / 2, 20 / 3) = 6.7 s, worse than max(6, 20 / 4) = 6 s: hold.
    out = live.on_step(_record(1, 5.0, 6.0), _leases())
    assert out["elastic"]["action"] == "hold"
    assert out["elastic"]["reason"] == "no_predicted_gain:borrow"


def test_approved_plan_can_return_part_of_the_lent_workers() -> None:
    live = _live(min_dwell_steps=0)
    live.on_step(_record(1, 1.0, 10.0), _leases())
    # 3 lent, 1 rollout worker left; the trainer waits 8 s (ratio trigger, 8 / 2 >= 1.25).
    # Fitted: w_train = 10 then 2 s x 4 workers, w_rollout = 4 then 8 s x 1 worker (EMA 0.3).
    out = live.on_step(_record(2, 8.0, 2.0), _leases(training=3, hybrid_rollout=0))
    decision = out["decision"]
    assert (decision["trigger"], decision["applied"]) == ("rollout_train_ratio", True)
    assert decision["current"] == {"train_workers": 4, "rollout_workers": 1}
    assert decision["inputs"]["w_train"] == pytest.approx(0.7 * 10 + 0.3 * 8)
    assert decision["inputs"]["w_rollout"] == pytest.approx(0.7 * 4 + 0.3 * 8)
    # T(t) = max(9.4 / t, 5.2 / (5 - t)): t = 3 -> max(3.13, 2.6) beats t = 4 -> 5.2.
    assert decision["candidate"] == {"train_workers": 3, "rollout_workers": 2}
    assert (out["elastic"]["action"], out["elastic"]["desired_hybrids"]) == ("release", 2)


def test_ttl_expiry_releases_everything() -> None:
    live = _live(ttl_steps=3)
    out = live.on_step(_record(1, 1.0, 10.0), _leases())
    assert (out["elastic"]["action"], out["elastic"]["ttl_step"]) == ("join", 4)
    assert live.signal_at(4)["action"] == "join"
    expired = live.signal_at(5)
    assert (expired["action"], expired["desired_hybrids"], expired["reason"]) == (
        "release", 0, "ttl_expired"
    )


def test_interval_decision_applies_the_best_split_through_the_pool() -> None:
    live = _live(interval_steps=1)
    out = live.on_step(_record(1, 1.0, 10.0), _leases())
    decision = out["decision"]
    # w_train = 10 x 1, w_rollout = 1 x 4; T(t) = max(10 / t, 4 / (5 - t)): t = 3 is best.
    assert (decision["trigger"], decision["applied"], decision["reason"]) == (
        "interval", True, "applied_via_elastic"
    )
    assert decision["current"] == {"train_workers": 1, "rollout_workers": 4}
    assert decision["candidate"] == {"train_workers": 3, "rollout_workers": 2}
    assert decision["raw_gain_s"] == pytest.approx(10.0 - 10.0 / 3)
    assert decision["net_gain_s"] == pytest.approx(10.0 - 10.0 / 3 - 1.0)
    assert (out["elastic"]["action"], out["elastic"]["desired_hybrids"]) == ("join", 2)
    assert out["elastic"]["reason"] == "approved_plan"
    json.dumps(out, allow_nan=False)


def test_transition_cost_blocks_the_plan_but_not_the_hysteresis() -> None:
    live = _live(interval_steps=1, transition_cost_s=100.0)
    out = live.on_step(_record(1, 1.0, 10.0), _leases())
    assert (out["decision"]["applied"], out["decision"]["reason"]) == (
        False, "net_gain_not_positive"
    )
    assert out["elastic"]["reason"] == "borrow"


def test_ratio_trigger_and_pressure_inputs() -> None:
    live = _live()
    out = live.on_step(_record(3, 13.0, 10.0), _leases())
    assert (out["decision"]["fired"], out["decision"]["trigger"]) == (True, "rollout_train_ratio")
    out = live.on_step(_record(4, 1.0, 10.0), _leases(),
                       {"queue_pressure": 0.9, "active_pressure": 0.1, "rejected_total": 2})
    assert out["decision"]["trigger"] == "queue_pressure"
    assert out["decision"]["inputs"]["queue_pressure"] == 0.9
    assert out["elastic"]["reason"] == "rollout_pressure"


def test_reserve_limits_what_may_be_lent() -> None:
    live = _live(reserve_workers=3)
    out = live.on_step(_record(1, 1.0, 10.0), _leases())
    # 4 rollout-side workers, 3 kept: 1 hybrid may be lent.
    assert (out["elastic"]["desired_hybrids"], out["decision"]["inputs"]["capacity"]) == (1, 1)
    live = _live(reserve_workers=4)
    out = live.on_step(_record(1, 1.0, 10.0), _leases())
    assert (out["elastic"]["action"], out["elastic"]["reason"]) == ("hold", "no_capacity")


def test_warmup_and_cooldown_gates() -> None:
    live = _live(interval_steps=1, warmup_steps=2, cooldown_steps=2)
    assert live.on_step(_record(1, 1.0, 10.0), _leases())["decision"]["reason"] == "warmup"
    assert live.on_step(_record(2, 1.0, 10.0), _leases())["decision"]["applied"] is True
    out = live.on_step(_record(3, 1.0, 10.0), _leases(joining=2, hybrid_rollout=1))
    assert out["decision"]["reason"] == "cooldown"


def test_pool_without_training_is_a_documented_refusal_keeping_the_ttl() -> None:
    live = _live(ttl_steps=2)
    live.on_step(_record(1, 1.0, 10.0), _leases())
    no_trainer = [lease for lease in _leases() if lease["role"] != "core-training"]
    out = live.on_step(_record(2, 1.0, 10.0), no_trainer)
    assert out["decision"]["reason"].startswith("pool_invalid: no core-training worker")
    assert out["elastic"]["action"] == "join"  # the previous signal, TTL running
    out = live.on_step(_record(4, 1.0, 10.0), no_trainer)
    assert (out["elastic"]["action"], out["elastic"]["reason"]) == ("release", "ttl_expired")
    no_rollout = [{"role": "core-training"}, {"role": "service"}]
    assert live.on_step(_record(5, 1.0, 1.0), no_rollout)["decision"]["reason"].startswith(
        "pool_invalid: no rollout"
    )


@pytest.mark.parametrize(
    ("record", "field"),
    [({"step": 1, "rollout_s": 1.0}, "record.train_s"),
     ({"step": 1, "rollout_s": -1.0, "train_s": 1.0}, "record.rollout_s"),
     ({"step": "x", "rollout_s": 1.0, "train_s": 1.0}, "record.step"),
     ({"step": 1, "rollout_s": float("nan"), "train_s": 1.0}, "record.rollout_s")],
)
def test_malformed_record_is_a_plan_error_naming_the_field(record: dict, field: str) -> None:
    with pytest.raises(PlanError, match=field):
        _live().on_step(record, _leases())


def test_unknown_role_is_a_plan_error_and_lease_objects_are_accepted() -> None:
    with pytest.raises(PlanError, match=r"leases\[1\]\.role"):
        count_roles([{"role": "core-training"}, {"role": "trainer"}])
    lease = Lease(WorkerId("w"), WorkerRole.HYBRID_JOINING, "", "", 0, 0, 0)
    assert count_roles([lease]).hybrid_joining == 1


def test_bad_knobs_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="elastic_release_ratio"):
        LivePlanner(LiveConfig(borrow_ratio=0.9, release_ratio=1.0))
    with pytest.raises(ValueError, match="ema_alpha"):
        LiveConfig(ema_alpha=0.0)


def test_cost_model_scales_with_workers_and_fits_by_ema() -> None:
    model = LiveCostModel(alpha=0.5)
    model.observe(train_s=10.0, n_train=1, rollout_s=4.0, n_rollout=2)
    assert model.times_s(2, 4) == (5.0, 2.0)
    model.observe(train_s=4.0, n_train=2, rollout_s=4.0, n_rollout=2)
    assert model.w_train == pytest.approx(9.0) and model.w_rollout == pytest.approx(8.0)
    assert model.times_s(0, 1)[0] == float("inf")


def test_observe_matches_the_coordinator_planner_protocol() -> None:
    decision, signal = _live().observe(_record(1, 1.0, 10.0), _leases(), {})
    assert (signal.action, signal.desired, signal.current, signal.reason, signal.ttl_step) == (
        "join", 2, 0, "borrow", 4
    )
    assert decision["elastic"]["desired_hybrids"] == 2 and "raw_gain_s" in decision


# Spec knobs named differently in LiveConfig; knobs of the executor and the trainer.
RENAMED = {"pressure_threshold": "pressure_cap", "plan_interval_steps": "interval_steps"}
NOT_PLANNER = {"enabled", "join_timeout_s", "gradient_deadline_s", "lockstep_check_interval"}


def test_live_planner_maps_every_planner_knob_of_the_elastic_spec() -> None:
    spec = ElasticSpec(enabled=True, reserve_workers=2, borrow_ratio=1.5, release_ratio=0.5,
                       pressure_threshold=0.6, ttl_steps=7, plan_interval_steps=3,
                       cooldown_steps=4, warmup_steps=5, transition_cost_s=2.5,
                       min_gain_ratio=0.2)
    config = live_planner(spec).config
    live_fields = {f.name for f in dataclasses.fields(LiveConfig)}
    for knob in (f.name for f in dataclasses.fields(ElasticSpec)):
        if knob in NOT_PLANNER:
            assert knob not in live_fields
            continue
        assert getattr(config, RENAMED.get(knob, knob)) == getattr(spec, knob), knob
    # Knobs without a spec key keep their defaults; the unleased trainer is counted.
    assert config.min_history_trajectories == LiveConfig().min_history_trajectories
    assert config.ema_alpha == LiveConfig().ema_alpha
    assert config.min_core_training == 1


def test_live_planner_refuses_bad_spec_knobs() -> None:
    with pytest.raises(ValueError, match="elastic_release_ratio"):
        live_planner(ElasticSpec(borrow_ratio=1.0, release_ratio=1.0))


def test_unleased_trainer_counts_as_the_core_training_worker() -> None:
    rollout_only = [{"role": "core-rollout"}, {"role": "hybrid-rollout"},
                    {"role": "hybrid-rollout"}]
    assert _live().on_step(_record(1, 1.0, 10.0), rollout_only)["decision"][
        "reason"].startswith("pool_invalid: no core-training worker")
    out = _live(min_core_training=1).on_step(_record(1, 1.0, 10.0), rollout_only)
    assert out["decision"]["inputs"]["pool"]["core_training"] == 1
    assert (out["elastic"]["action"], out["elastic"]["desired_hybrids"]) == ("join", 2)
    # A leased trainer is not counted twice.
    out = _live(min_core_training=1).on_step(_record(1, 1.0, 10.0), _leases())
    assert out["decision"]["inputs"]["pool"]["core_training"] == 1
    with pytest.raises(ValueError, match="min_core_training"):
        LiveConfig(min_core_training=-1)


def test_hybrids_that_trained_come_from_the_trainer_record() -> None:
    # 2 hybrids active, 1 gradient arrived (the other slice was reassigned to the core):
    # 2 workers trained, so w_train = 4 s x 2.
    live = _live()
    live.on_step(_record(1, 1.0, 4.0, hybrid_workers=2, hybrid_slices=1.0,
                         reassigned_slices=1.0), _leases(training=2, hybrid_rollout=1))
    assert live.model.w_train == pytest.approx(8.0)
    live = _live()
    live.on_step(_record(1, 1.0, 4.0, hybrid_workers=2), _leases(training=2, hybrid_rollout=1))
    assert live.model.w_train == pytest.approx(12.0)
    with pytest.raises(PlanError, match="record.hybrid_workers"):
        _live().on_step(_record(1, 1.0, 4.0, hybrid_workers="two"), _leases())


def test_force_hybrids_pins_the_pool_whatever_the_ratio() -> None:
    live = _live(force_hybrids=1)
    # Rollout-bound (the planner alone would not lend), yet one worker is kept lent.
    out = live.on_step(_record(1, 20.0, 1.0), _leases())
    assert (out["elastic"]["action"], out["elastic"]["desired_hybrids"],
            out["elastic"]["reason"]) == ("join", 1, "forced")
    out = live.on_step(_record(2, 20.0, 1.0), _leases(training=1, hybrid_rollout=2))
    assert (out["elastic"]["action"], out["elastic"]["desired_hybrids"]) == ("hold", 1)


def test_force_hybrids_is_capped_by_the_capacity() -> None:
    out = _live(force_hybrids=9).on_step(_record(1, 1.0, 10.0), _leases())
    assert out["elastic"]["desired_hybrids"] == 3
