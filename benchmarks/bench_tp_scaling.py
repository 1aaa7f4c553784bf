"""TP scaling of the simulator's roofline: decode latency and per-GPU throughput.

For a model preset on a hardware preset, prints per TP degree and batch size the
decode step time and the output tokens per second per GPU, with the calibrated engine
physics (``sim/presets.py``) and, for comparison, the roofline without them (zero
per-step overhead and interference, all-reduce at the link peak: the physics before
issue 20 item 1).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_tp_scaling.py [--hw a800] [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from scheduling.planner import step_s
from sim.presets import hardware, model

TPS = (1, 2, 4, 8)
BATCHES = (1, 8, 32, 128)
CONTEXT_TOKENS = 4096
"""Mean context of a decoding sequence (an agentic turn a few thousand tokens in)."""


def ideal(hw: Any) -> Any:
    """The pre-calibration roofline: no per-step overhead or interference, link-peak
    all-reduce, 10 us latency."""
    return replace(
        hw,
        engine_step_overhead_s=0.0,
        mixed_batch_interference=0.0,
        allreduce_bus_bw_bytes_per_s=0.0,
        allreduce_latency_s=10e-6,
    )


def table(hw_name: str, model_name: str) -> list[dict[str, Any]]:
    """One row per (physics, TP, batch)."""
    hw, mdl = hardware(hw_name), model(model_name)
    rows = []
    for label, spec in (("calibrated", hw), ("ideal", ideal(hw))):
        base = {b: step_s(spec, mdl, 1, b, b * CONTEXT_TOKENS) for b in BATCHES}
        for tp in TPS:
            for b in BATCHES:
                t = step_s(spec, mdl, tp, b, b * CONTEXT_TOKENS)
                rows.append(
                    {
                        "physics": label,
                        "tp": tp,
                        "batch": b,
                        "step_ms": t * 1e3,
                        "speedup_vs_tp1": base[b] / t,
                        "tokens_per_s_per_gpu": b / t / tp,
                    }
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hw", default="a800")
    parser.add_argument("--model", default="qwen3-14b")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = table(args.hw, args.model)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.model} on {args.hw}, context {CONTEXT_TOKENS} tokens per sequence")
    print(f"{'physics':11} {'tp':>3} {'batch':>5} {'step ms':>8} {'speedup':>8} {'tok/s/GPU':>10}")
    for r in rows:
        print(
            f"{r['physics']:11} {r['tp']:3d} {r['batch']:5d} {r['step_ms']:8.2f} "
            f"{r['speedup_vs_tp1']:8.2f} {r['tokens_per_s_per_gpu']:10.1f}"
        )


if __name__ == "__main__":
    main()
