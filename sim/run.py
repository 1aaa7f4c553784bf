"""Run one system on one cluster and trace; summarise into the ``libra sim`` JSON."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np

from scheduling.planner import (
    ClusterShape,
    GlobalResourcePlanner,
    Plan,
    PlanError,
    PlanSearch,
    RequestStats,
    SearchSpace,
    TrainParallelism,
    pipeline_depth,
)
from sim.bounds import lower_bound_s
from sim.engine import Simulator
from sim.instance import SimInfeasible
from sim.presets import WEIGHT_LOAD_BW_BYTES_PER_S, ClusterSpec
from sim.systems import SystemConfig, reference_train_gpus
from sim.trace import TraceTrajectory
from sim.twin import TwinRefiner
from sim.twin_slice import TWIN_SLICE_NODES

STARTUP_PROFILE_SIZE = 64
"""Trajectories of the first step the preflight sees (reference: 64-prompt startup profile)."""


def initial_plan(
    cluster: ClusterSpec, trace: list[TraceTrajectory], system: SystemConfig,
    twin_workers: int = 1, twin_slice_nodes: int | None = TWIN_SLICE_NODES,
) -> tuple[Plan, GlobalResourcePlanner | None, dict[str, Any] | None, TwinRefiner | None]:
    """Split and layout at time 0, the planner (for online systems), the preflight event
    and the planner's twin (systems with ``planner_twin``; ``twin_workers``: its
    processes, ``twin_slice_nodes``: its slice of a large fleet, ``TwinRefiner``).

    Raises:
        SimInfeasible: If no instance type holds the longest trajectory.
    """
    first = min(t.step for t in trace)
    step0 = [t for t in trace if t.step == first]
    if system.mode == "sync":
        pattern = system.node_patterns[0]
        return (
            Plan(TrainParallelism(8, 1, 0), tuple([pattern] * cluster.num_nodes)), None, None, None
        )
    if system.train_gpus is not None:
        return static_plan(cluster, system), None, None, None
    if not (system.enable_replan or system.enable_elastic):
        # A static peer without a split runs at the reference's: a preflight would make
        # its split depend on the seed's first step (issue 20).
        split = reference_train_gpus(cluster.num_nodes, cluster.gpus_per_node)
        fixed = system.with_split(split, system.node_patterns[0], "reference")
        return static_plan(cluster, fixed), None, None, None
    history = [
        RequestStats(t.prompt_tokens, t.post_prompt_tokens, t.tool_s)
        for t in step0[:STARTUP_PROFILE_SIZE]
    ]
    shape = ClusterShape(cluster.num_nodes, cluster.gpus_per_node)
    space = SearchSpace(
        node_patterns=system.node_patterns,
        train_tp=min(8, cluster.gpus_per_node),
        min_train_nodes=1,
        min_rollout_nodes=1,
    )
    config = replace(
        system.planner_config, pipeline_depth=pipeline_depth(system.staleness),
        weight_load_bw_bytes_per_s=WEIGHT_LOAD_BW_BYTES_PER_S,
    )
    twin = None
    if system.planner_twin:
        twin = TwinRefiner(cluster, system, workers=twin_workers, slice_nodes=twin_slice_nodes)
        twin.observe_step(step0[:STARTUP_PROFILE_SIZE], provisional=True)
    planner = GlobalResourcePlanner(
        PlanSearch(cluster.hardware, cluster.model, shape, space, refiner=twin), config
    )
    planner.add_history(history)
    event = planner.preflight(len(step0))
    if planner.current is None:
        raise SimInfeasible("planner preflight found no feasible plan (model or KV does not fit)")
    online = system.enable_replan or system.enable_elastic
    return planner.current, planner if online else None, event.to_dict(), twin


def static_plan(cluster: ClusterSpec, system: SystemConfig) -> Plan:
    """The fixed split of a static system: TP8 (or one node) replicas, one node pattern.

    Raises:
        PlanError: If the split is not whole nodes or leaves a stage without a node.
    """
    gpn = cluster.gpus_per_node
    train_nodes = (system.train_gpus or 0) // gpn
    tp = min(8, gpn)
    plan = Plan(
        TrainParallelism(tp, 1, train_nodes * gpn // tp),
        (system.node_patterns[0],) * (cluster.num_nodes - train_nodes),
    )
    if train_nodes * gpn != system.train_gpus:
        raise PlanError(f"train_gpus: {system.train_gpus} is not whole {gpn}-GPU nodes")
    plan.validate(ClusterShape(cluster.num_nodes, gpn))
    return plan


def max_rollout_gpus(cluster: ClusterSpec, system: SystemConfig) -> int:
    """The most devices that can generate at once: all of them in a colocated loop; in a
    disaggregated one every plan keeps a training node (``Plan.validate``) and the
    elastic pool only lends rollout nodes to training."""
    if system.mode == "sync":
        return cluster.num_gpus
    return cluster.num_gpus - cluster.gpus_per_node


def steady_throughput(
    train_log: list[dict[str, Any]], trace: list[TraceTrajectory], pipeline_depth: int
) -> float | None:
    """Trajectories per second between the end of the fill and the start of the drain.

    The first ``pipeline_depth`` steps are released before any training has ended (fill)
    and the last ``pipeline_depth`` steps are trained while no new step is released
    (drain); both are excluded. The rate is the steady steps' trajectories over the time
    between the training end of the last fill step and that of the last steady step.
    ``None`` when the run has no steady step (fewer than ``2 * pipeline_depth + 1`` steps).
    """
    first, last = pipeline_depth - 1, len(train_log) - 1 - pipeline_depth
    if last <= first:
        return None
    per_step: dict[int, int] = {}
    for t in trace:
        per_step[t.step] = per_step.get(t.step, 0) + 1
    end_s = [r["start_s"] + r["train_s"] for r in train_log]
    # A bounded batch may be larger than its step's share: count what it trained.
    done = sum(
        r.get("trajectories", per_step[r["step"]]) for r in train_log[first + 1 : last + 1]
    )
    return done / (end_s[last] - end_s[first])


def run(
    cluster: ClusterSpec, trace: list[TraceTrajectory], system: SystemConfig,
    twin_workers: int = 1, twin_slice_nodes: int | None = TWIN_SLICE_NODES,
) -> dict[str, Any]:
    """Simulate and summarise; an infeasible workload yields ``{"feasible": false, ...}``.
    ``twin_workers``: processes the planner's twin scores a decision's plans on (the
    result does not depend on it); ``twin_slice_nodes``: the twin's slice of a large
    fleet (``None``: the whole fleet; ``sim.twin.TwinRefiner``)."""
    started = time.perf_counter()
    need = max(t.total_tokens for t in trace)
    fitted = system.fitting(cluster.hardware, cluster.model, need)
    base = {"system": system.name, "cluster": cluster.to_dict(), "num_trajectories": len(trace)}
    if not fitted.node_patterns:
        return {
            **base,
            "feasible": False,
            "reason": f"longest trajectory needs {need} KV tokens; no instance of the system's "
            f"layouts (TP {system.tps()}) holds it on {cluster.hardware.name}",
        }
    twin = None
    try:
        plan, planner, preflight, twin = initial_plan(
            cluster, trace, fitted, twin_workers, twin_slice_nodes
        )
        raw = Simulator(cluster, trace, fitted, plan, planner, twin=twin).run()
    except SimInfeasible as exc:
        return {**base, "feasible": False, "reason": str(exc)}
    finally:
        if twin is not None:
            twin.close()
    staleness = 0 if fitted.mode == "sync" else fitted.staleness
    twin_runs = twin.runs if twin is not None else 0
    bound = lower_bound_s(
        cluster, trace, staleness, stream=fitted.consumption != "barrier",
        group=fitted.consume_unit == "group", max_rollout_gpus=max_rollout_gpus(cluster, fitted),
    )
    makespan = raw["makespan_s"]
    lat = np.array(raw["latencies_s"])
    tokens = sum(t.total_tokens for t in trace)
    busy = (raw["rollout_busy_gpu_s"] + raw["train_busy_gpu_s"]) / (cluster.num_gpus * makespan)
    log = raw["train_log"]
    return {
        **base,
        "feasible": True,
        "throughput_traj_per_s": len(trace) / makespan,
        "steady_throughput_traj_per_s": steady_throughput(log, trace, pipeline_depth(staleness)),
        "tokens_per_s": tokens / makespan,
        "makespan_s": makespan,
        "lower_bound_s": bound["lower_bound_s"],
        "makespan_over_bound": makespan / bound["lower_bound_s"],
        "bound_terms": bound,
        "p99_traj_latency_s": float(np.percentile(lat, 99)),
        "mean_traj_latency_s": float(lat.mean()),
        "gpu_busy_fraction": busy,
        "migrations": raw["migrations"],
        "planner_moves": raw["planner_moves"],
        "rejected_admissions": raw["rejected"],
        "max_kv_fraction": raw["max_kv_fraction"],
        "bucket_busy_fraction": raw["bucket_busy_fraction"],
        "idle_while_queued": raw["idle_while_queued"],
        "policy_stats": raw["policy_stats"],
        "initial_plan": plan.to_dict(),
        "mean_train_s": float(np.mean([r["train_s"] for r in log])),
        "mean_rollout_interval_s": float(np.mean([r["rollout_s"] for r in log])),
        "num_plan_events": len(raw["plan_events"]),
        "plans_applied": sum(1 for e in raw["plan_events"] if e["applied"]),
        "move_log": raw["move_log"],
        "reconfigure_strategy": fitted.reconfigure_strategy,
        "twin_runs": twin_runs,
        "consumption": fitted.consumption,
        "consume_unit": fitted.consume_unit,
        "max_consumed_staleness": max(raw["consumed_staleness"], default=0),
        "mean_consumed_staleness": float(np.mean(raw["consumed_staleness"] or [0])),
        "partial_rollouts": raw["partial_rollouts"],
        "sync_interval": fitted.sync_interval,
        "drain_s": raw["drain_s"],
        "sim_wall_s": time.perf_counter() - started,
    }
