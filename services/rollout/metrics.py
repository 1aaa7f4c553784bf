"""Prometheus view of one rollout instance, read from the core at scrape time.

``libra_rollout_trajectories_finished_total{instance}`` and
``libra_rollout_tokens_generated_total{instance}`` give trajectories/s and tokens/s with
``rate()``; ``libra_rollout_active_trajectories``, ``libra_rollout_policy_version`` and
``libra_rollout_role{instance,role}`` (1 for the role held now) describe it now;
``libra_rollout_engine_batch_size{instance}`` is the histogram of engine calls by batch
size; ``libra_rollout_engine_context_tokens`` and ``..._context_limit_tokens`` the
engine's context use (when the engine reports it: the torch engine does);
``libra_rollout_weight_reload_seconds`` times each policy load (the weight loader tells
it). A collector keeps the core free of metrics code: it only keeps plain counters.
Definitions live in libra/metrics.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import REGISTRY, Collector

from libra import metrics
from libra import types as t
from services.rollout.core import RolloutCore
from services.rollout.engine_types import EngineCallLog

# (context tokens held at the end of the last call, tokens the engine can hold at once).
ContextUsage = Callable[[], tuple[int, int]]


def logged_context_usage(calls: EngineCallLog, context_tokens: Callable[[], int],
                         max_batch_size: int) -> ContextUsage:
    """Context use of a turn-batched engine from its call log: the last call's context
    (prompts plus sampled tokens: the KV positions it held when it ended) against
    ``max_batch_size`` sequences of the job's context length."""

    def usage() -> tuple[int, int]:
        last = calls.last()
        used = last.prompt_tokens + last.new_tokens if last is not None else 0
        return used, max_batch_size * context_tokens()

    return usage


def batch_buckets(batch_sizes: dict[int, int]) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs over libra.metrics.BATCH_BUCKETS, then +Inf."""
    buckets = []
    for bound in metrics.definition("libra_rollout_engine_batch_size").buckets:
        buckets.append((repr(bound), float(sum(n for size, n in batch_sizes.items()
                                               if size <= bound))))
    buckets.append(("+Inf", float(sum(batch_sizes.values()))))
    return buckets


class RolloutCollector(Collector):
    """Reads the core's counters and its loop profile's batch tally on each scrape."""

    def __init__(self, core: RolloutCore, context_usage: ContextUsage | None = None) -> None:
        self._core = core
        self._context_usage = context_usage

    def collect(self) -> Iterator[Metric]:
        core = self._core
        instance = core.settings.instance_id
        for name, count in (("libra_rollout_trajectories_finished", core.trajectories_finished),
                            ("libra_rollout_tokens_generated", core.tokens_generated)):
            d = metrics.definition(name)
            family = CounterMetricFamily(d.name, d.help, labels=list(d.labels))
            family.add_metric([instance], count)
            yield family
        for name, value in (("libra_rollout_active_trajectories", core.num_active),
                            ("libra_rollout_policy_version", core.policy_version)):
            yield _gauge(name, [instance], value)
        lease = core.lease
        held = lease.role.value if lease is not None else ""
        role = _gauge_family("libra_rollout_role")
        for r in t.WorkerRole:
            role.add_metric([instance, r.value], 1.0 if r.value == held else 0.0)
        yield role
        d = metrics.definition("libra_rollout_engine_batch_size")
        sizes = dict(core.profile.batch_sizes)
        batch = HistogramMetricFamily(d.name, d.help, labels=list(d.labels))
        batch.add_metric([instance], batch_buckets(sizes),
                         float(sum(size * n for size, n in sizes.items())))
        yield batch
        if self._context_usage is not None:
            used, limit = self._context_usage()
            yield _gauge("libra_rollout_engine_context_tokens", [instance], used)
            yield _gauge("libra_rollout_engine_context_limit_tokens", [instance], limit)


def _gauge_family(name: str) -> GaugeMetricFamily:
    d = metrics.definition(name)
    return GaugeMetricFamily(d.name, d.help, labels=list(d.labels))


def _gauge(name: str, labels: list[str], value: float) -> GaugeMetricFamily:
    family = _gauge_family(name)
    family.add_metric(labels, value)
    return family


_registered: RolloutCollector | None = None


def register(core: RolloutCore, context_usage: ContextUsage | None = None) -> None:
    """Expose the core on the process's /metrics endpoint (the latest core's, when a
    process serves more than one in turn), with the engine's context use when given, and
    time the core's weight loads."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = RolloutCollector(core, context_usage)
    REGISTRY.register(_registered)
    reload_s = metrics.histogram("libra_rollout_weight_reload_seconds").labels(
        core.settings.instance_id)
    core.weights.on_reload = reload_s.observe
