"""``libra bench paper``: every system on the three workloads, a table and a PNG chart.

Scale: 48 GPUs = 6 nodes x 8 A800, Qwen3-14B, 16 prompts x 4 samples per step (the
reference 48-GPU arm trains 8 x 4 per step; we double it so each rollout instance
sees more than one trajectory), 20 steps. ``--gpus 1000``: 125 nodes of H100,
320 prompts x 4 per step, 8 steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from sim.generators import SHAPES, GeneratorConfig, generate
from sim.presets import cluster
from sim.run import run
from sim.systems import SYSTEM_NAMES, system

SCALES = {
    48: {"cluster": "a800x48", "prompts_per_step": 16, "num_steps": 20},
    1000: {"cluster": "h100x1000", "prompts_per_step": 320, "num_steps": 8},
}


def run_paper(
    gpus: int = 48,
    seeds: int = 3,
    shapes: tuple[str, ...] = SHAPES,
    systems: tuple[str, ...] = SYSTEM_NAMES,
) -> dict[str, Any]:
    """Run the grid; return per-cell results and mean/spread summaries."""
    if gpus not in SCALES:
        raise ValueError(f"--gpus must be one of {sorted(SCALES)}, got {gpus}")
    scale = SCALES[gpus]
    spec = cluster(scale["cluster"])
    started = time.perf_counter()
    cells: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {n: [] for n in systems} for s in shapes
    }
    for shape in shapes:
        for seed in range(seeds):
            trace = generate(
                GeneratorConfig(
                    shape=shape,
                    num_steps=scale["num_steps"],
                    prompts_per_step=scale["prompts_per_step"],
                    seed=seed,
                )
            )
            for name in systems:
                cells[shape][name].append(run(spec, trace, system(name)))
    return {
        "gpus": gpus,
        "cluster": spec.to_dict(),
        "seeds": seeds,
        "cells": cells,
        "summary": summarise(cells),
        "wall_s": time.perf_counter() - started,
    }


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
                "p99_latency_s": float(np.mean([r["p99_traj_latency_s"] for r in ok])),
                "gpu_busy": float(np.mean([r["gpu_busy_fraction"] for r in ok])),
                "migrations": float(np.mean([r["migrations"] for r in ok])),
                "planner_moves": float(np.mean([r["planner_moves"] for r in ok])),
            }
        if "libra" in rows and rows["libra"].get("throughput_mean"):
            lib = rows["libra"]["throughput_mean"]
            peers = {
                n: r["throughput_mean"]
                for n, r in rows.items()
                if n not in ("libra", "sync-lb") and r.get("throughput_mean")
            }
            best = max(peers, key=peers.get) if peers else None
            rows["_ratios"] = {
                "libra_vs_sync_lb": lib / rows["sync-lb"]["throughput_mean"]
                if rows.get("sync-lb", {}).get("throughput_mean")
                else None,
                "best_peer": best,
                "libra_vs_best_peer": lib / peers[best] if best else None,
            }
        out[shape] = rows
    return out


def _mean_or_none(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def table(result: dict[str, Any]) -> str:
    """Plain-text table of the summary."""
    lines = [
        f"libra bench paper: {result['cluster']['name']} ({result['cluster']['model']}), "
        f"{result['seeds']} seed(s), {result['wall_s']:.1f} s",
        f"{'workload':8} {'system':13} {'traj/s':>8} {'spread':>7} {'steady':>7} {'mk/LB':>6} "
        f"{'mk/chn':>6} {'p99 s':>8} {'busy':>5} {'migr':>6} {'moves':>5}",
    ]
    for shape, rows in result["summary"].items():
        for name, row in rows.items():
            if name.startswith("_"):
                continue
            if not row.get("throughput_mean"):
                lines.append(f"{shape:8} {name:13} infeasible")
                continue
            lines.append(
                f"{shape:8} {name:13} {row['throughput_mean']:8.3f} "
                f"{row['throughput_spread']:7.1%} {_fmt(row['steady_mean'])} "
                f"{row['makespan_over_bound']:6.2f} {row['makespan_over_chain']:6.2f} "
                f"{row['p99_latency_s']:8.1f} "
                f"{row['gpu_busy']:5.2f} {row['migrations']:6.0f} {row['planner_moves']:5.1f}"
            )
        ratios = rows.get("_ratios")
        if ratios:
            lines.append(
                f"{'':8} libra / sync-lb = {ratios['libra_vs_sync_lb']:.2f}x; libra / best peer "
                f"({ratios['best_peer']}) = {ratios['libra_vs_best_peer']:.2f}x"
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
