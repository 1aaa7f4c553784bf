"""``benchmarks/bench_moves.py``: one forced move per arm, on the same state."""

from __future__ import annotations

from benchmarks import bench_moves


def test_the_same_move_loses_under_restart_what_migrate_keeps() -> None:
    restart = bench_moves.one("r2e", 0, "restart_all", 10)
    migrate = bench_moves.one("r2e", 0, "migrate", 10)
    ideal = bench_moves.one("r2e", 0, bench_moves.IDEAL, 10)
    assert restart["move"]["lost_tokens"] == migrate["move"]["kept_tokens"] > 0
    assert restart["predicted"] == migrate["predicted"] == ideal["predicted"]
    # Three TP8 nodes re-laid at once; the ideal arm loads in no time.
    assert restart["move"]["max_nodes_out"] == 3
    assert ideal["move"]["end_s"] - ideal["move"]["start_s"] < 1e-6
    assert migrate["move"]["end_s"] - migrate["move"]["start_s"] > 3.0
    assert 0 < ideal["predicted"]["migrated_s"] < ideal["predicted"]["recreated_s"]
