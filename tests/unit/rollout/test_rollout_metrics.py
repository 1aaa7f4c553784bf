"""The rollout instance's /metrics view after it generated a real trajectory.

Real: the rollout core (rig: in-memory store, scripted engine), its loop profile, the
collector registered in a prometheus-client registry served over HTTP on a free port.
"""

from __future__ import annotations

import urllib.request

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from services.rollout.metrics import RolloutCollector, batch_buckets
from tests.unit.rollout.rig import HERE, Rig, make_task


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            text = reply.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_finished_trajectory_tokens_batch_and_role_are_exported(rig: Rig) -> None:
    registry = CollectorRegistry()
    registry.register(RolloutCollector(rig.core))
    before = _scrape(registry)
    me = frozenset({("instance", HERE)})
    assert before[("libra_rollout_trajectories_finished_total", me)] == 0
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task())
    await rig.run_until_published()
    got = _scrape(registry)
    assert got[("libra_rollout_trajectories_finished_total", me)] == 1
    assert got[("libra_rollout_tokens_generated_total", me)] == rig.core.tokens_generated > 0
    assert got[("libra_rollout_engine_batch_size_count", me)] >= 1
    assert got[("libra_rollout_policy_version", me)] == 0
    roles = {dict(labels)["role"]: v for (name, labels), v in got.items()
             if name == "libra_rollout_role"}
    assert roles["core-rollout"] == 1 and sum(roles.values()) == 1


def test_batch_buckets_are_cumulative() -> None:
    buckets = dict(batch_buckets({1: 2, 3: 1, 300: 1}))
    assert (buckets["1.0"], buckets["2.0"], buckets["4.0"], buckets["256.0"],
            buckets["+Inf"]) == (2, 2, 3, 3, 4)
