"""The control-plane benchmark (benchmarks/bench_control_plane.py) at its smoke size, so
it keeps running: 4 synthetic instances x 8 trajectories against the real coordinator,
scheduler and Redis. Its window ends on counts (20 decisions, 8 finishes), not on time;
the figures themselves are not judged here (docs/operations.md has them)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.integration.stack_helpers import ROOT

pytestmark = pytest.mark.integration


def test_the_benchmark_drives_the_real_protocol_at_a_tiny_size() -> None:
    run = subprocess.run([sys.executable, "benchmarks/bench_control_plane.py", "--quick",
                          "--json"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["instances"] == 4 and result["in_flight_target"] == 32
    assert 0 < result["in_flight"] <= 32  # never past the instances' caps
    # Placements were decided, reports answered, trajectories published and read back.
    assert result["reports"] > 0 and result["finished"] > 0 and result["probes"] >= 0
    assert result["decisions_per_s"] > 0 and result["finished_per_s"] > 0
    assert result["errors"] == 0 and result["fenced"] == 0
    # A 30 s TTL renewed every 10 s: no lease lapses while its holder runs.
    assert result["leases_lost_with_fill"] == 0
    for figure in ("tick_p50_ms", "tick_p99_ms", "decide_batch_p99_ms",
                   "client_decision_p99_ms", "redis_ops_per_s", "redis_used_memory_mb",
                   "scheduler_cpu_pct", "coordinator_cpu_pct", "renewals_per_s",
                   "lease_ttl_ms", "killed", "killed_expired"):
        assert figure in result, figure
    assert result["tick_p99_ms"] > 0  # the scheduler's tick histogram was scraped
    # Ticks also gave their own steps' wall and CPU time (counts are not compared: the
    # scrape reads the histograms one by one while ticks go on).
    assert result["tick_count"] > 0
    assert result["tick_own_count"] > 0 and result["tick_cpu_count"] > 0
    assert result["tick_own_p99_ms"] > 0 and result["tick_cpu_p99_ms"] > 0
    assert 0 < result["tick_p99_est_ms"] <= result["tick_p99_ms"]
    # Every decided batch observed its wait for a running tick (0 for most).
    assert result["tick_wait_count"] > 0 and "host_late_max_ms" in result
