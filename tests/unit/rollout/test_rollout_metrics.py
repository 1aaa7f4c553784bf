"""The rollout instance's /metrics view after it generated a real trajectory.

Real: the rollout core (rig: in-memory store, scripted engine), its loop profile, the
collector registered in a prometheus-client registry served over HTTP on a free port;
weight loads timed into the process's registry, as the service does.
"""

from __future__ import annotations

import urllib.request

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from services.rollout import metrics as rollout_metrics
from services.rollout.engine_types import EngineCall, EngineCallLog
from services.rollout.metrics import RolloutCollector, batch_buckets, logged_context_usage
from tests.unit.rollout.rig import HERE, Rig, make_task
from tests.waiting import wait_until


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


# -- the reload phase and the engine's context use -----------------------------------------

def _reloads() -> float:
    return REGISTRY.get_sample_value("libra_rollout_weight_reload_seconds_count",
                                     {"instance": HERE}) or 0.0


async def test_each_completed_weight_load_is_timed_and_a_refused_one_is_not(rig: Rig) -> None:
    rollout_metrics.register(rig.core)
    before = _reloads()
    rig.engine.queue("<ans>3</ans>")
    await rig.place(make_task(0))
    await rig.run_until_published(1)
    assert rig.core.policy_version == 0
    assert _reloads() == before + 1  # version 0 loaded (checksum verified, swapped)
    await rig.write_weights(1, sha256="0" * 64)
    await wait_until(lambda: rig.events("weights_checksum_mismatch"))
    assert _reloads() == before + 1  # refused: no reload happened
    assert REGISTRY.get_sample_value("libra_rollout_weight_reload_seconds_sum",
                                     {"instance": HERE}) >= 0.0


def _call(prompt_tokens: int, new_tokens: int) -> EngineCall:
    return EngineCall(at_s=0.0, batch=2, prompt_len=prompt_tokens, prompt_tokens=prompt_tokens,
                      decode_steps=new_tokens, new_tokens=new_tokens, wall_s=0.1,
                      aborted=False)


def test_context_use_is_the_last_calls_context_against_batch_times_context() -> None:
    calls = EngineCallLog()
    limit = {"tokens": 0}
    usage = logged_context_usage(calls, lambda: limit["tokens"], max_batch_size=8)
    assert usage() == (0, 0)  # before any job and any call
    limit["tokens"] = 2048
    calls.record(_call(100, 20))
    calls.record(_call(300, 40))
    assert usage() == (340, 8 * 2048)


async def test_context_gauges_are_exported_when_the_engine_reports_them(rig: Rig) -> None:
    registry = CollectorRegistry()
    registry.register(RolloutCollector(rig.core, lambda: (340, 16384)))
    got = _scrape(registry)
    me = frozenset({("instance", HERE)})
    assert got[("libra_rollout_engine_context_tokens", me)] == 340
    assert got[("libra_rollout_engine_context_limit_tokens", me)] == 16384
    bare = CollectorRegistry()
    bare.register(RolloutCollector(rig.core))  # vLLM: no context view, no series
    assert ("libra_rollout_engine_context_tokens", me) not in _scrape(bare)
