"""TorchTrainerBackend on one HF model: PPO-step tokens/s with and without gradient
checkpointing.

A batch of ``--batch`` sequences of ``--seq-len`` tokens at most (lengths spread over the
upper quarter, so padding is realistic; the loss mask covers each sequence's last two
thirds, like a completion after a prompt) goes through ``train_step``: the proximal
log-prob recompute (forward, no grad), then forward + backward + AdamW step. Reports the
forward+backward+step tokens/s (``fwd_bwd_s``), the recompute tokens/s and the whole
step's, as medians over ``--rounds``; the two modes alternate (which goes first flips each
round) after one warm-up step each. Peak CUDA memory is reported on CUDA.

Usage::

    .venv/bin/python benchmarks/bench_trainer_hf.py --model /tmp/smollm2 [--batch 16]
        [--seq-len 256] [--rounds 2] [--threads 1] [--device cpu] [--dtype auto] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _samples(vocab_size: int, batch: int, seq_len: int, seed: int = 0) -> list:
    from libra.training.samples import TrainSample

    rng = random.Random(seed)
    samples = []
    for index in range(batch):
        length = rng.randint(3 * seq_len // 4, seq_len)
        prompt = length // 3
        samples.append(TrainSample(
            token_ids=[rng.randrange(vocab_size) for _ in range(length)],
            loss_mask=[0] * prompt + [1] * (length - prompt),
            rollout_logprobs=[0.0] * prompt + [-2.0] * (length - prompt),
            advantage=1.0 if index % 2 else -1.0, group_id=f"g{index // 4}",
            trajectory_id=f"t{index}"))
    return samples


def _backend(args, checkpointing: bool):
    from libra.models.hf import load_causal_lm, load_tokenizer
    from libra.training.torch_backend import TorchTrainerBackend

    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, dtype=args.dtype, device=args.device)
    return TorchTrainerBackend(model, pad_token_id=tokenizer.pad_token_id, seed=0,
                               learning_rate=1e-6, num_threads=args.threads,
                               device=args.device, gradient_checkpointing=checkpointing)


def _step(backend, samples) -> dict[str, float]:
    import torch

    if backend.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(backend.device)
    started = time.perf_counter()
    metrics = backend.train_step(samples)
    metrics["step_s"] = time.perf_counter() - started
    if backend.device.type == "cuda":
        metrics["peak_mem_gib"] = torch.cuda.max_memory_allocated(backend.device) / 2**30
    return metrics


def _summary(runs: list[dict[str, float]], tokens: int) -> dict[str, float]:
    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    out = {"fwd_bwd_tokens_per_s": round(tokens / median("fwd_bwd_s"), 1),
           "recompute_tokens_per_s": round(tokens / median("recompute_s"), 1),
           "step_tokens_per_s": round(tokens / median("step_s"), 1),
           "fwd_bwd_s": round(median("fwd_bwd_s"), 3)}
    if "peak_mem_gib" in runs[0]:
        out["peak_mem_gib"] = round(max(run["peak_mem_gib"] for run in runs), 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="HF model directory")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if any)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    from libra.models.hf import default_device

    torch.set_num_threads(args.threads)
    args.device = args.device or default_device()
    backends = {"plain": _backend(args, False), "checkpointed": _backend(args, True)}
    vocab_size = int(backends["plain"].model.config.vocab_size)
    samples = _samples(vocab_size, args.batch, args.seq_len)
    tokens = sum(len(sample.token_ids) for sample in samples)
    for backend in backends.values():
        _step(backend, samples)  # warm-up
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in backends}
    for round_index in range(args.rounds):
        names = list(backends) if round_index % 2 == 0 else list(reversed(backends))
        for name in names:
            runs[name].append(_step(backends[name], samples))
    results = {name: _summary(runs[name], tokens) for name in backends}
    compute = str(backends["plain"].compute_dtype)
    out = {"model": args.model, "device": args.device, "compute_dtype": compute,
           "threads": args.threads, "batch": args.batch, "seq_len_max": args.seq_len,
           "tokens": tokens, "rounds": args.rounds, "results": results}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{args.model} on {args.device} (compute {compute}, {args.threads} thread(s)): "
          f"{args.batch} sequences <= {args.seq_len} tokens ({tokens} tokens), "
          f"median of {args.rounds}")
    for name, row in results.items():
        print(f"{name:>13}: fwd+bwd+step {row['fwd_bwd_tokens_per_s']:8.1f} tok/s  "
              f"recompute {row['recompute_tokens_per_s']:8.1f} tok/s  "
              f"whole step {row['step_tokens_per_s']:8.1f} tok/s")
    ratio = (results["checkpointed"]["fwd_bwd_tokens_per_s"]
             / results["plain"]["fwd_bwd_tokens_per_s"])
    print(f"checkpointed / plain fwd+bwd+step: {ratio:.2f}x")


if __name__ == "__main__":
    main()
