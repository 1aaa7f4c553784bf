"""The compared systems, as configurations of one simulator on the same GPUs and trace.

Only configuration differs between systems: placement policy, rollout layout family,
RL mode (synchronous colocated or asynchronous disaggregated with a staleness bound)
and whether the planner replans online and drives the elastic pool. Static systems
run at a fixed split (``train_gpus``) and one node pattern: the reference's split by
default (``sim.run.initial_plan``), or their own best split and layout from
``sim.sweep`` (an oracle). Only libra's planner chooses its split.

``stream-lb`` is the AReaL / verl-fully-async-like peer: least-loaded on homogeneous TP2
instances, streaming consumption under the same per-trajectory staleness bound as
libra (``bounded``, bound 4: the reference's ``max_head_offpolicyness`` default, its
AReaL-style staleness manager; verl V1's ``max_off_policy_threshold`` in ``wait``
mode also waits rather than drops). ``stream-lb-unbounded`` is the same peer with
the bound only at admission (releases gated, no per-trajectory cut-off; observed
staleness 15-18): a labelled extra row, never the headline peer (``headline=False``).
``libra`` consumes ``bounded`` too (``scheduling.staleness``, ``sim.weight_sync``).

Weight sync (``sync_interval``, ``drain_before_sync``): each system syncs as its
counterpart does by default. The reference's trainer (NetX-lab/Libra
``trainer/async_rl_trainer.py``) syncs every ``sync_interval`` steps (5 in its
48-GPU production config, ``configs/..._6node48_production_base.yaml``), and first
pauses dispatch and waits until in-flight rollouts finish (``dispatcher.pause()``,
``wait_until_idle``), the training loop blocked meanwhile: the reference's scheduler
arms (``async-lb`` = its ``_homogeneous_lb`` control, ``length-aware``, ``la-mlfq``)
run so. AReaL updates weights after every step and interrupts generation (no drain):
``stream-lb``. Colocated ``sync-lb`` reloads every step. libra syncs every step with
partial rollout, its design's default (``libra.jobspec`` ``sync_interval = 1``).
Versions count optimizer steps, as the reference's do (``set_version(step + 1)`` at a
sync): a trajectory's version is the trainer step of the weights it started under.

``toolcount`` is not compared: its priority orders two queues. In the scheduler's
pending queue (where the service applies it) no trajectory has begun, so every
priority is 0; in an instance's waiting queue (where the simulator applied it) the
order never changed a result: it equalled ``async-lb`` in every cell, to the last
digit (issue 20). It cannot bind where it is applied, so it is dropped from the
comparison; the policy stays available to jobs (``policy: toolcount``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from libra.errors import InvalidArgument
from libra.types import Bucket
from scheduling.planner import HardwareSpec, ModelSpec, PlannerConfig, kv_capacity_tokens
from scheduling.policy import CmlfqConfig, LaMlfqConfig, LengthAwareConfig
from sim import moves
from sim.trainer import CONSUMPTION_MODES, check_consume_unit

HOMOGENEOUS = ((2, 2, 2, 2),)
"""8 x TP2 per node: the reference's homogeneous-LB control arm."""
REFERENCE_HETEROGENEOUS = ((1, 1, 2, 4),)
"""Per-node TP1, TP1, TP2, TP4: the reference 48-GPU production layout."""
LIBRA_PATTERNS = (
    (1, 1, 2, 4),
    (1, 1, 1, 1, 4),
    (2, 2, 4),
    (1, 1, 2, 2, 2),
    (2, 2, 2, 2),
    (4, 4),
    (8,),
)

BUCKET_MAX_TOKENS = {1: 4_000, 2: 12_000, 4: 30_000, 8: 40_960}
"""Remaining-length threshold of the bucket of each TP degree (reference 48-GPU
Qwen3-14B config: short TP1 <= 4,000, medium TP2 <= 12,000, long TP4 <= 30,000; TP8
from the Search-R1 config's long bucket, 40,960)."""

REFERENCE_TRAIN_FRACTION = 32 / 48
"""Training share of the GPUs in the reference 48-GPU Qwen3-14B arms (``train_gpus: 32``,
``rollout_gpus: 16`` in ``configs/r2e_gym_qwen3_14b_mcore_gpu_6node48_100step*.yaml``)."""

REFERENCE_SYNC_INTERVAL = 5
"""Steps between weight syncs in the reference's 48-GPU production arms
(``sync_interval: 5``, ``configs/r2e_gym_qwen3_14b_mcore_gpu_6node48_production_base.yaml``;
its code default is 1, its 100-step validation arms use 25)."""

TRAJECTORIES_PER_TP = 32
"""Per-instance cap on pinned trajectories = 32 x TP (stands in for the reference's
``max_queue_length``; binding only under overload)."""


@dataclass(frozen=True, kw_only=True)
class SystemConfig:
    """One compared system."""

    name: str
    policy: str
    policy_config: Any = None
    mode: str = "async"
    """``sync`` (colocated: rollout then train on all GPUs) or ``async`` (disaggregated)."""
    staleness: int = 4
    """Rollouts of step s may start once version >= s - staleness (reference bound 4)."""
    node_patterns: tuple[tuple[int, ...], ...] = HOMOGENEOUS
    enable_replan: bool = False
    enable_elastic: bool = False
    planner_config: PlannerConfig = field(default_factory=PlannerConfig)
    size_thresholds: tuple[int, int] = (500, 5000)
    """Payload small / large thresholds in tokens (reference defaults)."""
    train_gpus: int | None = None
    """Static split: training GPUs (whole nodes); rollout nodes all run
    ``node_patterns[0]``. ``None``: the reference's split for a static system, the
    planner's preflight for one that replans."""
    split_label: str = ""
    """Where a static split came from (``reference``, ``oracle``), for reports."""
    planner_twin: bool = False
    """Score the planner's top candidates with the twin simulation (``sim/twin.py``)
    instead of the greedy closed form."""
    consumption: str = "barrier"
    """``barrier``: step s trains on step s's trajectories once all finished (the
    reference, verl, slime); ``stream``: on the first trajectories to finish, whatever
    their step (AReaL, verl fully-async); ``bounded``: streaming under a per-trajectory
    staleness bound with partial rollout (libra; ``scheduling.staleness``). See
    ``sim.trainer.BatchSource``."""
    consume_unit: str = "group"
    """What a streaming consumption takes as one unit (``sim.trainer.BatchSource``):
    ``group``, a prompt's samples once the last finishes (the reference, AReaL and our
    trainer train only complete GRPO groups), or ``trajectory`` (each on its own, the
    simulator before session 14; kept for the ablation)."""
    sync_interval: int = 1
    """Training steps between weight syncs to the rollout instances (the counterpart's
    default; see the module docstring)."""
    drain_before_sync: bool = False
    """At a sync, stop dispatching and wait for in-flight trajectories to finish, the
    trainer waiting too (the reference); otherwise generation continues across it."""
    headline: bool = True
    """Counts as a peer in the headline ratios (``False``: a labelled extra row)."""
    reconfigure_strategy: str = "restart_all"
    """How a planner move changes the rollout nodes (``sim.moves``): ``restart_all``
    (session 15: changed nodes re-created at once, their turns restart), ``drain``,
    ``migrate``, ``staged``, ``staged_migrate``, ``prewarm``, ``prewarm_migrate``."""
    reconfigure_stage_nodes: int = 1
    """Nodes changed at once by the ``staged`` strategies."""
    pool_keeps_partial: bool = False
    """Under a ``migrate`` strategy, a node the elastic pool lends to training also
    hands its turns on with their generated tokens (else they restart)."""

    def __post_init__(self) -> None:
        self._check_sync()
        moves.strategy(self.reconfigure_strategy)
        n = self.reconfigure_stage_nodes
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgument(
                "reconfigure_stage_nodes", f"system {self.name!r}: must be an integer >= 1, "
                f"got {n!r}"
            )
        check_consume_unit(self.consume_unit)
        if self.consumption not in CONSUMPTION_MODES:
            raise ValueError(
                f"system {self.name!r}: consumption must be one of "
                f"{', '.join(CONSUMPTION_MODES)}, got {self.consumption!r}"
            )
        if self.consumption != "barrier" and self.mode == "sync":
            raise ValueError(f"system {self.name!r}: a synchronous loop cannot stream")

    def _check_sync(self) -> None:
        """``sync_interval`` must be a whole number of steps the loop can keep to."""
        n = self.sync_interval
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgument(
                "sync_interval", f"system {self.name!r}: must be an integer >= 1, got {n!r}"
            )
        if self.mode == "sync" and n != 1:
            raise InvalidArgument(
                "sync_interval",
                f"system {self.name!r}: a colocated loop reloads weights every step, got {n}",
            )
        if self.consumption == "bounded" and n > self.staleness + 1:
            # A trajectory started just before a sync would be past the bound before the
            # next sync could give newer weights: every step would wait on it.
            raise InvalidArgument(
                "sync_interval",
                f"system {self.name!r}: {n} exceeds staleness + 1 = {self.staleness + 1}; "
                f"bounded consumption could never train what starts late in an interval",
            )
        if self.drain_before_sync and (self.enable_replan or self.enable_elastic):
            raise InvalidArgument(
                "drain_before_sync", f"system {self.name!r}: not modelled with replanning"
            )

    def with_split(self, train_gpus: int, pattern: tuple[int, ...], label: str) -> SystemConfig:
        """This system at a fixed split and one node pattern (static systems only)."""
        if self.enable_replan or self.enable_elastic or self.mode == "sync":
            raise ValueError(f"system {self.name!r} does not run at a static split")
        return replace(
            self, train_gpus=train_gpus, node_patterns=(tuple(pattern),), split_label=label
        )

    def tps(self) -> list[int]:
        """TP degrees the system's layouts can contain."""
        return sorted({tp for p in self.node_patterns for tp in p})

    def bucket_for_tp(self, tp: int) -> str:
        """Bucket name of an instance of ``tp``."""
        return f"tp{tp}"

    def buckets(self, hw: HardwareSpec, model: ModelSpec) -> list[Bucket]:
        """One bucket per TP degree, short (small TP) first."""
        return [
            Bucket(self.bucket_for_tp(tp), BUCKET_MAX_TOKENS[tp], tp, 256, TRAJECTORIES_PER_TP * tp)
            for tp in self.tps()
        ]

    def fitting(self, hw: HardwareSpec, model: ModelSpec, need_tokens: int) -> SystemConfig:
        """Drop node patterns with an instance whose KV cache cannot hold ``need_tokens``."""
        ok = tuple(
            p
            for p in self.node_patterns
            if all(kv_capacity_tokens(hw, model, tp) >= need_tokens for tp in p)
        )
        return replace(self, node_patterns=ok)


_LIBRA_INTERVAL_STEPS = 5
_LIBRA_PLANNER = PlannerConfig(
    plan_interval_steps=_LIBRA_INTERVAL_STEPS,
    warmup_steps=2,
    min_history_size=20,
    transition_cost_s=30.0,
    cooldown_steps=1,
    # Issue 20, session 15: a per-step gain is counted over the steps the plan runs
    # before the next interval decision, against the move's cost including the
    # in-flight work of the rollout devices it re-creates; and a gain must exceed the
    # twin's +-15% agreement band (what it resolves), not the reference's 5%.
    gain_horizon_steps=_LIBRA_INTERVAL_STEPS,
    # Session 16: libra's moves migrate in-flight turns one node at a time
    # (``staged_migrate``, below), so a move costs its weight load and re-prefill.
    transition_cost_model="migrated",
    min_gain_ratio=0.15,
    # The twin scores what it simulates; a ratio fitted to the closed form would
    # distort it. The twin costs ~0.1-1 s per plan, so libra replans on the interval
    # and on pressure, not on the rollout/train ratio that fires almost every step.
    calibrate=False,
    rollout_train_ratio_threshold=math.inf,
    # The pool follows a smoothed rollout-span estimate and holds each change 3 steps
    # (issue 20: the trigger on inter-completion gaps flapped one node every step).
    elastic_span_alpha=0.3,
    elastic_dwell_steps=3,
    # Issue 20, session 16: the preflight adopts one TP degree (a mix waits for an
    # online decision with a history the twin has not cycled), and a borrow of the
    # pool is judged by the twin like a plan (a ratio of measured times cannot see a
    # bounded step waiting on its stragglers).
    preflight_layouts="homogeneous",
    elastic_borrow_judged=True,
)
_STATIC_PLANNER = PlannerConfig(enable_online=False, enable_elastic=False)

SYSTEMS: dict[str, SystemConfig] = {
    "sync-lb": SystemConfig(
        name="sync-lb",
        policy="least_loaded",
        mode="sync",
        staleness=0,
        node_patterns=HOMOGENEOUS,
        planner_config=_STATIC_PLANNER,
    ),
    "async-lb": SystemConfig(
        name="async-lb",
        policy="least_loaded",
        node_patterns=HOMOGENEOUS,
        planner_config=_STATIC_PLANNER,
        sync_interval=REFERENCE_SYNC_INTERVAL,
        drain_before_sync=True,
    ),
    "length-aware": SystemConfig(
        name="length-aware",
        policy="length_aware",
        policy_config=LengthAwareConfig(),
        node_patterns=REFERENCE_HETEROGENEOUS,
        planner_config=_STATIC_PLANNER,
        sync_interval=REFERENCE_SYNC_INTERVAL,
        drain_before_sync=True,
    ),
    "stream-lb": SystemConfig(
        name="stream-lb",
        policy="least_loaded",
        node_patterns=HOMOGENEOUS,
        planner_config=_STATIC_PLANNER,
        consumption="bounded",
    ),
    "stream-lb-unbounded": SystemConfig(
        name="stream-lb-unbounded",
        policy="least_loaded",
        node_patterns=HOMOGENEOUS,
        planner_config=_STATIC_PLANNER,
        consumption="stream",
        headline=False,
    ),
    "la-mlfq": SystemConfig(
        name="la-mlfq",
        policy="la_mlfq",
        policy_config=LaMlfqConfig(),
        node_patterns=REFERENCE_HETEROGENEOUS,
        planner_config=_STATIC_PLANNER,
        sync_interval=REFERENCE_SYNC_INTERVAL,
        drain_before_sync=True,
    ),
    "libra": SystemConfig(
        name="libra",
        policy="cmlfq",
        policy_config=CmlfqConfig(rebuild_interval_steps=5),
        node_patterns=LIBRA_PATTERNS,
        enable_replan=True,
        enable_elastic=True,
        planner_config=_LIBRA_PLANNER,
        planner_twin=True,
        consumption="bounded",
        # Issue 20, session 16 (docs/simulator.md): on forced re-layouts (tuning seeds)
        # the cheapest real strategy; capacity never drops by more than one node.
        reconfigure_strategy="staged_migrate",
        pool_keeps_partial=True,
    ),
}
SYSTEM_NAMES = tuple(SYSTEMS)
STATIC_PEERS = tuple(
    n for n, c in SYSTEMS.items() if c.mode == "async" and not (c.enable_replan or c.enable_elastic)
)
"""Peers that run at a static split: compared at the reference's split and their oracle."""


def reference_train_gpus(num_nodes: int, gpus_per_node: int) -> int:
    """The reference's split scaled to ``num_nodes``: whole nodes, both stages kept."""
    nodes = min(num_nodes - 1, max(1, round(num_nodes * REFERENCE_TRAIN_FRACTION)))
    return nodes * gpus_per_node


def system(name: str) -> SystemConfig:
    """System by name. Raises ``ValueError`` listing the valid names."""
    if name not in SYSTEMS:
        raise ValueError(f"unknown system {name!r}; valid: {', '.join(SYSTEM_NAMES)}")
    return SYSTEMS[name]
