"""Issue 6 item 5: a real CPU run of the demo, replayed in the simulator with the
instances' measured engine and event-loop costs; predicted vs measured rollout time (mean
admission -> finish per trajectory) must agree within +-20%. Takes ~20-60 s (a short SFT
warm-up, 12 RL steps)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from libra_cli.sim_validation import TOLERANCE, validate
from tests.integration.stack_helpers import ROOT

pytestmark = pytest.mark.integration


def test_predicted_rollout_time_within_20_percent_of_measured(tmp_path: Path) -> None:
    result = validate(tmp_path, ROOT)
    inputs = result["measured_inputs"]
    print(json.dumps({k: result[k] for k in (
        "num_trajectories", "predicted_rollout_s", "measured_rollout_s", "ratio")}
                     | inputs["measured_gaps"] | inputs["rpc_latency_sources"]))
    assert result["num_trajectories"] >= 100
    # The loop's own costs were measured in the run, not taken from an idle stack.
    assert set(inputs["loop_costs"]) == {"rollout-0", "rollout-1"}
    assert abs(result["ratio"] - 1.0) <= TOLERANCE, result
