"""``libra bench paper``: every system on the three workloads, a table and a PNG chart.

Scale: 48 GPUs = 6 nodes x 8 A800, Qwen3-14B, 16 prompts x 4 samples per step (the
reference 48-GPU arm trains 8 x 4 per step; we double it so each rollout instance
sees more than one trajectory), 20 steps. ``--gpus 1000``: 125 nodes of H100,
320 prompts x 4 per step, 8 steps.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from sim.generators import DRIFT_VARIANTS, SHAPES, generate, workload_config
from sim.presets import ClusterSpec, cluster
from sim.run import run
from sim.sweep import best_static
from sim.systems import (
    STATIC_PEERS,
    SYSTEM_NAMES,
    SystemConfig,
    reference_train_gpus,
    system,
)

SCALES = {
    48: {"cluster": "a800x48", "prompts_per_step": 16, "num_steps": 20},
    1000: {"cluster": "h100x1000", "prompts_per_step": 320, "num_steps": 8},
}
TUNING_SEEDS = (0,)
"""Seeds the oracle sweep tunes on (its choice is then applied to every seed)."""
HELD_OUT_FIRST_SEED = 10
"""``--held-out`` runs seeds from here on: never used to tune anything (issue 20 item 6)."""
ORACLE_SUFFIX = "@oracle"


def _trace(scale: dict[str, Any], shape: str, seed: int) -> list[Any]:
    """A workload's trace: a shape or a drift variant (``workload_config``)."""
    return generate(
        workload_config(
            shape,
            num_steps=scale["num_steps"],
            prompts_per_step=scale["prompts_per_step"],
            seed=seed,
        )
    )


def _arms(
    spec: Any, scale: dict[str, Any], shape: str, systems: tuple[str, ...], oracle: bool
) -> tuple[dict[str, SystemConfig], dict[str, Any]]:
    """Every system; static peers at the reference's split, plus their oracle arm."""
    ref_gpus = reference_train_gpus(spec.num_nodes, spec.gpus_per_node)
    arms: dict[str, SystemConfig] = {}
    choices: dict[str, Any] = {}
    for name in systems:
        conf = system(name)
        if name not in STATIC_PEERS:
            arms[name] = conf
            continue
        arms[name] = conf.with_split(ref_gpus, conf.node_patterns[0], "reference")
        if oracle:
            tuning = [_trace(scale, shape, seed) for seed in TUNING_SEEDS]
            best = best_static(spec, tuning, name)
            choices[name] = best
            arms[name + ORACLE_SUFFIX] = conf.with_split(
                best["train_gpus"], tuple(best["pattern"]), "oracle"
            )
    return arms, choices


def run_paper(
    gpus: int = 48,
    seeds: int = 3,
    shapes: tuple[str, ...] | None = None,
    systems: tuple[str, ...] = SYSTEM_NAMES,
    *,
    oracle: bool = False,
    held_out: bool = False,
    cluster_spec: ClusterSpec | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """Run the grid; return per-cell results and mean/spread summaries.

    Static peers run at the reference's split (32 of 48 GPUs training, scaled by node
    count); with ``oracle`` also at their own best split and layout (``sim.sweep``, tuned
    on ``TUNING_SEEDS``). ``held_out`` runs seeds ``HELD_OUT_FIRST_SEED`` onwards.
    ``cluster_spec`` replaces the scale's preset (the sensitivity table perturbs it).
    ``shapes`` defaults to the three shapes, plus the drift variants when ``held_out``.
    ``jobs`` > 1 runs the (workload, seed) cells in that many processes (results are
    the same: every run is deterministic).
    """
    if gpus not in SCALES:
        raise ValueError(f"--gpus must be one of {sorted(SCALES)}, got {gpus}")
    if seeds <= 0:
        raise ValueError(f"--seeds must be positive, got {seeds}")
    if jobs <= 0:
        raise ValueError(f"--jobs must be positive, got {jobs}")
    for name in systems:
        system(name)  # unknown names fail before any run
    if shapes is None:
        shapes = SHAPES + (tuple(DRIFT_VARIANTS) if held_out else ())
    for shape in shapes:
        workload_config(shape)  # unknown workloads fail before any run
    scale = SCALES[gpus]
    spec = cluster_spec or cluster(scale["cluster"])
    first_seed = HELD_OUT_FIRST_SEED if held_out else 0
    seed_list = list(range(first_seed, first_seed + seeds))
    started = time.perf_counter()
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {}
    oracle_choices: dict[str, Any] = {}
    tasks = []
    for shape in shapes:
        arms, oracle_choices[shape] = _arms(spec, scale, shape, systems, oracle)
        cells[shape] = {n: [] for n in arms}
        tasks += [(spec, scale, shape, seed, arms) for seed in seed_list]
    for shape, by_name in _run_cells(tasks, jobs):
        for name, result in by_name.items():
            cells[shape][name].append(result)
    return {
        "gpus": gpus,
        "cluster": spec.to_dict(),
        "seeds": seeds,
        "seed_list": seed_list,
        "oracle_choices": oracle_choices,
        "cells": cells,
        "summary": summarise(cells),
        "wall_s": time.perf_counter() - started,
    }


def _run_cell(task: tuple) -> tuple[str, dict[str, dict[str, Any]]]:
    """Every arm on one (workload, seed) trace."""
    spec, scale, shape, seed, arms = task
    trace = _trace(scale, shape, seed)
    return shape, {name: run(spec, trace, conf) for name, conf in arms.items()}


def _run_cells(tasks: list[tuple], jobs: int) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """Cells in task order, in ``jobs`` processes (inline for one)."""
    if jobs == 1 or len(tasks) <= 1:
        return [_run_cell(t) for t in tasks]
    with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
        return list(pool.map(_run_cell, tasks))


def summarise(cells: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Mean and spread (min-max relative to the mean) per shape x system, plus ratios."""
    out: dict[str, Any] = {}
    for shape, by_system in cells.items():
        rows = {}
        for name, results in by_system.items():
            ok = [r for r in results if r.get("feasible")]
            if not ok:
                rows[name] = {"feasible": False}
                continue
            thr = np.array([r["throughput_traj_per_s"] for r in ok])
            rows[name] = {
                "throughput_mean": float(thr.mean()),
                "throughput_spread": float((thr.max() - thr.min()) / thr.mean()),
                "steady_mean": _mean_or_none([r["steady_throughput_traj_per_s"] for r in ok]),
                "makespan_over_bound": float(np.mean([r["makespan_over_bound"] for r in ok])),
                "makespan_over_chain": float(
                    np.mean([r["makespan_s"] / r["bound_terms"]["step_chain_bound_s"] for r in ok])
                ),
                "makespan_over_throughput_chain": float(np.mean([
                    r["makespan_s"] / r["bound_terms"]["throughput_chain_bound_s"] for r in ok
                ])),
                "p99_latency_s": float(np.mean([r["p99_traj_latency_s"] for r in ok])),
                "gpu_busy": float(np.mean([r["gpu_busy_fraction"] for r in ok])),
                "migrations": float(np.mean([r["migrations"] for r in ok])),
                "planner_moves": float(np.mean([r["planner_moves"] for r in ok])),
                "plans_applied": float(np.mean([r.get("plans_applied", 0) for r in ok])),
                "max_staleness": float(np.mean([r["max_consumed_staleness"] for r in ok])),
                "sync_interval": ok[0].get("sync_interval", 1),
                "split": _split_label(ok[0]),
            }
        if "libra" in rows and rows["libra"].get("throughput_mean"):
            lib = rows["libra"]["throughput_mean"]
            ratios: dict[str, Any] = {
                "libra_vs_sync_lb": lib / rows["sync-lb"]["throughput_mean"]
                if rows.get("sync-lb", {}).get("throughput_mean")
                else None,
            }
            for label, oracle in (("best_peer", False), ("best_oracle_peer", True)):
                # Extra rows (``headline=False``: stream-lb without a per-trajectory
                # bound) are reported beside the headline, never as its best peer.
                peers = {
                    n: r["throughput_mean"]
                    for n, r in rows.items()
                    if n not in ("libra", "sync-lb")
                    and n.endswith(ORACLE_SUFFIX) == oracle
                    and system(n.removesuffix(ORACLE_SUFFIX)).headline
                    and r.get("throughput_mean")
                }
                best = max(peers, key=peers.get) if peers else None
                ratios[label] = best
                ratios[f"libra_vs_{label}"] = lib / peers[best] if best else None
            rows["_ratios"] = ratios
        out[shape] = rows
    return out


def _split_label(result: dict[str, Any]) -> str:
    """``train:rollout`` GPUs at the start (libra's planner may change it later)."""
    plan = result["initial_plan"]
    return f"{plan['train_gpus']}:{plan['rollout_gpus']}"


def _mean_or_none(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def table(result: dict[str, Any]) -> str:
    """Plain-text table of the summary."""
    lines = [
        f"libra bench paper: {result['cluster']['name']} ({result['cluster']['model']}), "
        f"seeds {result['seed_list'][0]}-{result['seed_list'][-1]}, {result['wall_s']:.1f} s; "
        f"split = train:rollout GPUs at start; {ORACLE_SUFFIX} = the peer's own best static "
        f"split and layout (oracle, tuned on seed(s) {list(TUNING_SEEDS)})",
        f"{'workload':8} {'system':19} {'split':>7} {'traj/s':>8} {'spread':>7} {'steady':>7} "
        f"{'mk/LB':>6} {'mk/chn':>6} {'mk/thr':>6} {'p99 s':>8} {'busy':>5} {'migr':>6} "
        f"{'moves':>5} {'appl':>4} {'stale':>5} {'sync':>4}",
    ]
    for shape, rows in result["summary"].items():
        for name, row in rows.items():
            if name.startswith("_"):
                continue
            if not row.get("throughput_mean"):
                lines.append(f"{shape:8} {name:19} infeasible")
                continue
            lines.append(
                f"{shape:8} {name:19} {row['split']:>7} {row['throughput_mean']:8.3f} "
                f"{row['throughput_spread']:7.1%} {_fmt(row['steady_mean'])} "
                f"{row['makespan_over_bound']:6.2f} {row['makespan_over_chain']:6.2f} "
                f"{row['makespan_over_throughput_chain']:6.2f} "
                f"{row['p99_latency_s']:8.1f} "
                f"{row['gpu_busy']:5.2f} {row['migrations']:6.0f} {row['planner_moves']:5.1f} "
                f"{row['plans_applied']:4.1f} {row['max_staleness']:5.1f} "
                f"{row['sync_interval']:4d}"
            )
        ratios = rows.get("_ratios")
        if ratios:
            text = f"{'':8} libra / sync-lb = {ratios['libra_vs_sync_lb']:.2f}x"
            for label in ("best_peer", "best_oracle_peer"):
                if ratios.get(label):
                    text += f"; libra / {ratios[label]} = {ratios[f'libra_vs_{label}']:.2f}x"
            lines.append(text)
    lines.append(
        "stale = max staleness of a trained trajectory (optimizer steps); sync = steps "
        "between weight syncs; rows of systems with headline=False are extras, not peers; "
        "mk/LB, mk/chn, mk/thr = makespan over the largest bound, the step chain and the "
        "throughput chain"
    )
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return f"{value:7.3f}" if value is not None else f"{'-':>7}"


def chart(result: dict[str, Any], path: Path) -> Path | None:
    """Grouped bar chart of throughput per workload and system (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    summary = result["summary"]
    shapes = list(summary)
    systems = [n for n in next(iter(summary.values())) if not n.startswith("_")]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(systems)
    for i, name in enumerate(systems):
        vals = [
            summary[s][name].get("throughput_mean", 0.0)
            / max(1e-12, summary[s]["sync-lb"].get("throughput_mean", 1.0))
            for s in shapes
        ]
        ax.bar(np.arange(len(shapes)) + i * width, vals, width, label=name)
    ax.set_xticks(np.arange(len(shapes)) + width * (len(systems) - 1) / 2, shapes)
    ax.set_ylabel("throughput / sync-lb")
    ax.set_title(
        f"Simulated {result['cluster']['name']} ({result['cluster']['model']}), "
        f"{result['seeds']} seeds"
    )
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
