"""The trainer's metrics: the staleness of what it trains on and the last eval round's
score (in-memory store, fake backend and coordinator: tests/unit/trainer/trainer_rig.py;
read back from prometheus-client's default registry, the one /metrics serves)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from libra import metrics
from tests.unit.trainer import trainer_rig
from tests.unit.trainer.test_trainer_eval import admit_round, eval_traj, set_eval_spec, write_eval
from tests.unit.trainer.trainer_rig import JOB, Rig, make_group
from tests.waiting import wait_until

rig = trainer_rig.rig  # the same fixture


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"job": JOB, **labels}) or 0.0


async def test_staleness_of_each_trained_trajectory_is_observed(rig: Rig) -> None:
    await rig.set_spec(num_steps=2, max_staleness=1)
    count, total, fresh = (sample("libra_trainer_staleness_count"),
                           sample("libra_trainer_staleness_sum"),
                           sample("libra_trainer_staleness_bucket", le="0.0"))
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: core.policy_version == 1)
    await rig.write(*make_group(1, version=0))  # one version behind at step 2
    await rig.run_job(core)
    assert sample("libra_trainer_staleness_count") - count == 4
    assert sample("libra_trainer_staleness_sum") - total == 2
    assert sample("libra_trainer_staleness_bucket", le="0.0") - fresh == 2


async def test_the_last_eval_round_sets_the_score(rig: Rig) -> None:
    # Other tests of this process record rounds of the same job id: start from none.
    metrics.gauge("libra_job_eval_round").labels(JOB).set(0)
    await set_eval_spec(rig)
    await admit_round(rig, 1, 2)
    await write_eval(rig, eval_traj(1, 0, 0, 1.0), eval_traj(1, 0, 1, 0.0))
    await rig.write(*make_group(0))
    core = rig.new_core()
    await core.start_job(JOB)
    await wait_until(lambda: sample("libra_job_eval_round") == 1)
    assert sample("libra_job_eval_score", measure="accuracy") == 0.5
    await admit_round(rig, 2, 2)
    await write_eval(rig, eval_traj(2, 0, 0, 1.0), eval_traj(2, 0, 1, 1.0))
    await rig.run_job(core)
    assert sample("libra_job_eval_round") == 2
    assert sample("libra_job_eval_score", measure="accuracy") == 1.0
    assert sample("libra_job_eval_score", measure="reward_mean") == 1.0
