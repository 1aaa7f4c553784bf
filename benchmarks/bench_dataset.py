"""Datasets: submit-time validation of a large JSONL, and prompts/s served by libra/data.

Writes a JSONL of ``--rows`` calc-words-shaped rows (question, answer, metadata; with
``--messages`` the prompt is a system + user message list) into a scratch folder, then
measures, in this process:

1. the coordinator's submit check (``check_job_dataset``) on the cold file: conversion
   to Arrow in a fresh ``datasets`` cache, whole-column checks, the first rows rendered
   (target: < 10 s for 1M rows), and again warm (the Arrow cache hit);
2. opening the cached dataset (what the scheduler and the trainer pay at job start);
3. prompts/s served: ``row(i)`` at random indices, and ``draw(d)`` in the serving order
   the scheduler uses (an epoch's permutation of all rows included);
4. memory: the process's anonymous and file-backed resident memory around the reads
   (rows are memory-mapped, so the heap should not grow with the file).

Prompts/s is compared with ``--consumption-prompts-s``, a generous bound on what an
example job consumes (the demo trains ~8 trajectories/s, i.e. ~2 prompts/s at 4 samples
per prompt; SmolLM2 is slower). ``--json`` for machines.

    python -m benchmarks.bench_dataset [--rows 1000000] [--reads 20000] [--messages]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from libra.data import check_job_dataset, open_job_dataset  # noqa: E402
from libra.jobspec import JobSpec, parse_job_spec  # noqa: E402

_STORY = "A baker bakes {a} trays of {b} rolls and sells {c} rolls. How many rolls are left?"


def write_jsonl(path: Path, num_rows: int, messages: bool) -> float:
    """Write the rows; returns the seconds it took (not part of any figure)."""
    started = time.perf_counter()
    rng = random.Random(0)
    with path.open("w") as out:
        for i in range(num_rows):
            a, b, c = rng.randint(12, 99), rng.randint(3, 19), rng.randint(12, 99)
            text = _STORY.format(a=a, b=b, c=c)
            prompt: Any = ([{"role": "system", "content": "Use the calculator."},
                            {"role": "user", "content": text}] if messages else text)
            out.write(json.dumps({"prompt": prompt, "answer": str(a * b - c),
                                  "metadata": {"expression": f"{a}*{b}-{c}", "i": i}}) + "\n")
    return time.perf_counter() - started


def job_spec(path: Path, messages: bool) -> JobSpec:
    field = 'messages_field = "prompt"\ntool_call_format = "hermes"\n' if messages else (
        'prompt_field = "prompt"\n')
    model = '[model]\nkind = "hf"\npath = "unused"\n' if messages else ""
    return parse_job_spec(
        f'{model}[task]\nkind = "jsonl"\npath = "{path}"\n{field}reference_field = "answer"\n'
        'metadata_field = "metadata"\neval_fraction = 0.01\n'
        "[algorithm]\nsft_steps = 0\nprompts_per_step = 8\nnum_steps = 600\n")


def memory_kib() -> dict[str, int]:
    """RssAnon / RssFile of this process (Linux), in KiB."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


def timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def serve_rates(spec: JobSpec, cache: Path, num_reads: int) -> dict[str, float]:
    """Open the cached dataset; prompts/s by random index and in serving order."""
    memory_before = memory_kib()
    dataset, open_s = timed(lambda: open_job_dataset(spec.task, cache_dir=str(cache)))
    split = dataset.train
    rng = random.Random(1)
    indices = [rng.randrange(len(split)) for _ in range(num_reads)]
    _, random_s = timed(lambda: [split.row(i) for i in indices])
    _, order_s = timed(lambda: split.epoch_order(0))
    _, draw_s = timed(lambda: [split.draw(d) for d in range(num_reads)])
    memory_after = memory_kib()
    return {"open_cached_s": open_s, "epoch_permutation_s": order_s,
            "random_prompts_per_s": num_reads / random_s,
            "served_prompts_per_s": num_reads / draw_s,
            "rss_anon_growth_mib": (memory_after["RssAnon"] - memory_before["RssAnon"]) / 1024,
            "rss_file_growth_mib": (memory_after["RssFile"] - memory_before["RssFile"]) / 1024}


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    path = workdir / "prompts.jsonl"
    write_s = write_jsonl(path, args.rows, args.messages)
    spec = job_spec(path, args.messages)
    cache = workdir / "datasets-cache"
    summary, cold_s = timed(lambda: check_job_dataset(spec, cache_dir=str(cache)))
    _, warm_s = timed(lambda: check_job_dataset(spec, cache_dir=str(cache)))
    figures = serve_rates(spec, cache, args.reads)
    return {"rows": args.rows, "layout": "messages" if args.messages else "text",
            "file_mib": path.stat().st_size / 2**20, "write_s": write_s,
            "train_rows": summary.num_train_rows, "eval_rows": summary.num_eval_rows,
            "check_cold_s": cold_s, "check_warm_s": warm_s, **figures,
            "consumption_prompts_per_s": args.consumption_prompts_s,
            "served_over_consumption": figures["served_prompts_per_s"]
            / args.consumption_prompts_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--messages", action="store_true", help="prompts as chat messages")
    parser.add_argument("--consumption-prompts-s", type=float, default=8.0)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="scratch folder (default: a temporary one, removed after)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-dataset-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value:,.3f}" if isinstance(value, float) else
                  f"{key:28s} {value}")
        verdict = "ok" if result["check_cold_s"] < 10 else "OVER the 10 s target"
        print(f"submit check of {result['rows']:,} rows: {result['check_cold_s']:.2f} s cold "
              f"({verdict}); served {result['served_prompts_per_s']:,.0f} prompts/s = "
              f"{result['served_over_consumption']:,.0f}x the consumption bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
