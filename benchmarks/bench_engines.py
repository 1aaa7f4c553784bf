"""Torch vs vLLM rollout engine on the same tiny demo model and the same batch.

Builds the demo-shaped tiny Llama (hidden 128, 2 layers, 4 heads, context 256) into a temp
model dir, loads it with each engine's loader (as the rollout service does), and measures:
engine start, sampled tokens/s for one batch (after a warm-up call), weight reload time.
Prints both engines side by side with the vLLM/torch ratio. Without vLLM (the main venv)
only the torch column is measured.

Usage (vLLM needs its own venv, see docs/vllm.md)::

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/bench_engines.py [--json]
        [--batch 16] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _measure(name: str, engine, requests, weights: str, repeats: int) -> dict:
    from services.rollout.engine_types import GenerationRequest  # noqa: F401

    engine.generate(requests[:2])  # warm-up
    best = float("inf")
    tokens = 0
    for _ in range(repeats):
        started = time.perf_counter()
        results = engine.generate(requests)
        elapsed = time.perf_counter() - started
        tokens = sum(len(r.token_ids) for r in results)
        best = min(best, elapsed)
    reloads = []
    for version in range(1, repeats + 1):
        started = time.perf_counter()
        engine.load_weights(weights, version)
        reloads.append(time.perf_counter() - started)
    return {"engine": name, "batch_s": round(best, 4), "tokens": tokens,
            "tokens_per_s": round(tokens / best, 1),
            "reload_ms": round(1000 * sorted(reloads)[len(reloads) // 2], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from libra import types as t
    from libra.models import TinyModelConfig, build_model, build_tokenizer, save_model_dir
    from services.rollout.backend import TorchEngineLoader
    from services.rollout.engine_types import GenerationRequest
    from services.rollout.vllm_engine import VllmEngineLoader, VllmEngineOptions, vllm_available

    tmp_dir = tempfile.TemporaryDirectory(prefix="bench-engines-")  # removed when collected
    model_dir = str(Path(tmp_dir.name) / "model")
    tokenizer = build_tokenizer()
    save_model_dir(build_model(TinyModelConfig(), seed=0), tokenizer, model_dir)
    weights = str(Path(model_dir) / "model.safetensors")
    policy = t.PolicyInfo(version=0, weights_path=weights, sha256="", model_dir=model_dir)
    prompts = [f"Q:{i * 7 % 100}+{i * 13 % 100}*{i % 9 + 1}=" for i in range(args.batch)]
    requests = [GenerationRequest(prompt_token_ids=tokenizer(p)["input_ids"],
                                  max_new_tokens=args.new_tokens, temperature=1.0, seed=i)
                for i, p in enumerate(prompts)]

    rows = []
    started = time.perf_counter()
    engine, _ = TorchEngineLoader(num_threads=1, seed=0).load(model_dir, policy)
    start_s = time.perf_counter() - started
    rows.append({**_measure("torch", engine, requests, weights, args.repeats),
                 "start_s": round(start_s, 2)})
    note = ""
    if vllm_available():
        loader = VllmEngineLoader(VllmEngineOptions(max_num_seqs=max(args.batch, 16)))
        started = time.perf_counter()
        engine, _ = loader.load(model_dir, policy)
        start_s = time.perf_counter() - started
        try:
            rows.append({**_measure("vllm", engine, requests, weights, args.repeats),
                         "start_s": round(start_s, 2)})
        finally:
            loader.shutdown()
    else:
        note = "vllm not installed here: run in .venv-vllm (make test-vllm builds it)"

    out = {"batch": args.batch, "new_tokens": args.new_tokens, "cores": os.cpu_count(),
           "engines": rows, "note": note}
    if len(rows) == 2:
        out["vllm_over_torch_tokens_per_s"] = round(rows[1]["tokens_per_s"]
                                                    / rows[0]["tokens_per_s"], 2)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"batch={args.batch} new_tokens={args.new_tokens} temperature=1 cores={os.cpu_count()}")
    print(f"{'engine':8} {'start_s':>8} {'batch_s':>8} {'tokens':>7} {'tok/s':>9} "
          f"{'reload_ms':>10}")
    for row in rows:
        print(f"{row['engine']:8} {row['start_s']:8.2f} {row['batch_s']:8.3f} "
              f"{row['tokens']:7d} {row['tokens_per_s']:9.1f} {row['reload_ms']:10.2f}")
    if "vllm_over_torch_tokens_per_s" in out:
        print(f"vllm/torch tokens/s ratio: {out['vllm_over_torch_tokens_per_s']}")
    if note:
        print(note)


if __name__ == "__main__":  # required: vLLM spawns its engine process
    main()
