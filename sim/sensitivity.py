"""Sensitivity of the comparison to every uncertain engine constant (issue 20 item 1).

For each constant in ``sim.presets.UNCERTAIN`` at its low, central and high value, run
every system at the reference split (``sim.paper.run_paper``) and rank them by mean
throughput per workload. A ranking that flips inside a constant's plausible range says
the comparison rests on that constant; one that holds says it does not.
"""

from __future__ import annotations

import time
from typing import Any

from sim.paper import SCALES, run_paper
from sim.presets import UNCERTAIN, cluster, perturbed
from sim.systems import SYSTEM_NAMES

LEVELS = ("low", "central", "high")


def ranking(summary_rows: dict[str, Any]) -> list[tuple[str, float]]:
    """Systems by mean throughput, best first (infeasible ones last, at 0)."""
    pairs = [
        (name, row.get("throughput_mean") or 0.0)
        for name, row in summary_rows.items()
        if not name.startswith("_")
    ]
    return sorted(pairs, key=lambda p: -p[1])


def run_sensitivity(
    gpus: int = 48,
    seeds: int = 1,
    shapes: tuple[str, ...] = ("r2e", "search", "math"),
    systems: tuple[str, ...] = SYSTEM_NAMES,
    constants: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Rankings per (constant, level, workload); the central runs are shared.

    Raises:
        ValueError: Unknown constant name (``perturbed`` lists the valid ones).
    """
    names = tuple(UNCERTAIN) if constants is None else constants
    base = cluster(SCALES[gpus]["cluster"])
    for name in names:
        perturbed(base, name, "central")  # unknown names fail before any run
    started = time.perf_counter()
    central = run_paper(gpus, seeds, shapes, systems, cluster_spec=base)["summary"]
    rows: list[dict[str, Any]] = []
    for name in names:
        for level in LEVELS:
            if level == "central":
                summary = central
            else:
                spec = perturbed(base, name, level)
                summary = run_paper(gpus, seeds, shapes, systems, cluster_spec=spec)["summary"]
            for shape in shapes:
                rank = ranking(summary[shape])
                rows.append(
                    {
                        "constant": name,
                        "level": level,
                        "value": getattr(
                            perturbed(base, name, level).hardware, UNCERTAIN[name].field
                        ),
                        "workload": shape,
                        "ranking": [n for n, _ in rank],
                        "throughput": {n: t for n, t in rank},
                    }
                )
    return {"gpus": gpus, "seeds": seeds, "rows": rows, "wall_s": time.perf_counter() - started}


def table(result: dict[str, Any]) -> str:
    """One line per (constant, level, workload): the ranking with libra's place."""
    lines = [
        f"sensitivity ({result['gpus']} GPUs, {result['seeds']} seed(s), reference split, "
        f"{result['wall_s']:.0f} s): systems by mean traj/s, best first",
        f"{'constant':25} {'level':7} {'value':>10} {'workload':8} {'libra':>5}  ranking",
    ]
    for r in result["rows"]:
        place = r["ranking"].index("libra") + 1 if "libra" in r["ranking"] else 0
        ranked = " > ".join(f"{n} {r['throughput'][n]:.3f}" for n in r["ranking"])
        lines.append(
            f"{r['constant']:25} {r['level']:7} {r['value']:10.4g} {r['workload']:8} "
            f"{place:5d}  {ranked}"
        )
    return "\n".join(lines)


def flips(result: dict[str, Any]) -> list[str]:
    """Constants whose low or high value changes the best system or libra's place."""
    out = []
    by_key: dict[tuple[str, str], dict[str, list[str]]] = {}
    for r in result["rows"]:
        by_key.setdefault((r["constant"], r["workload"]), {})[r["level"]] = r["ranking"]
    for (name, shape), levels in by_key.items():
        c = levels["central"]
        for level in ("low", "high"):
            other = levels[level]
            if other[0] != c[0] or ("libra" in c and other.index("libra") != c.index("libra")):
                out.append(f"{name}={level} on {shape}: {' > '.join(other[:3])} (central "
                           f"{' > '.join(c[:3])})")
    return out
