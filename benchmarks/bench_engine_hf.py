"""TorchEngine vs transformers ``model.generate`` on one HF model: sampled tokens/s.

Both arms use the same model object, the same left-padded chat prompts, the same
max_new_tokens and temperature (top-k and top-p off). Neither stops early: the engine's
requests carry no stop tokens, and ``generate`` runs with ``eos_token_id=None``, so both
sample exactly batch x new-tokens tokens (counted, not assumed). Time includes the
prefill. Per batch size the arms alternate over the rounds (which goes first flips each
round, so a slow spell on a shared machine hits both); prints the median tokens/s of each
and their ratio (engine / generate). All prompts are distinct unless ``--group-size`` > 1:
then each repeats that many times, as in a GRPO group's first turn, where the engine
prefills each distinct prompt once (``generate`` has no such shortcut).

Usage::

    .venv/bin/python benchmarks/bench_engine_hf.py --model /tmp/smollm2 [--batches 1,8,32]
        [--new-tokens 32] [--rounds 3] [--threads 1] [--device cpu] [--dtype auto]
        [--group-size 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_QUESTIONS = [
    "A shop sells {n} boxes of 6 eggs each day. How many eggs does it sell in a week?",
    "What is {n}*7+12? Use the calculator and explain each step.",
    "Tom had {n} apples and gave away 13. How many are left?",
    "Write a short haiku about the number {n}.",
]


def _prompts(tokenizer, batch: int, group_size: int) -> list[list[int]]:
    """Chat prompts of a few different lengths (so left padding is exercised); each
    distinct prompt ``group_size`` times in a row, as a GRPO group's first turn."""
    prompts = []
    for row in range(batch):
        index = row // group_size
        text = _QUESTIONS[index % len(_QUESTIONS)].format(n=17 + 5 * index)
        messages = [{"role": "user", "content": text}]
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        prompts.append(list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded))
    return prompts


def _run_engine(engine, prompts, new_tokens: int, temperature: float, seed: int) -> int:
    from services.rollout.engine_types import GenerationRequest

    requests = [GenerationRequest(prompt_token_ids=p, max_new_tokens=new_tokens,
                                  temperature=temperature, seed=seed + i)
                for i, p in enumerate(prompts)]
    return sum(len(result.token_ids) for result in engine.generate(requests))


def _run_generate(model, tokenizer, prompts, new_tokens: int, temperature: float) -> int:
    import torch

    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt").to(model.device)
    with torch.inference_mode():
        output = model.generate(
            **batch, max_new_tokens=new_tokens, do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None, top_k=0, top_p=1.0,
            eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
    return int(output.shape[0] * (output.shape[1] - batch["input_ids"].shape[1]))


def _measure(arms: dict, rounds: int) -> dict[str, list[float]]:
    """Tokens/s per arm and round; the arm order flips every round."""
    rates: dict[str, list[float]] = {name: [] for name in arms}
    for round_index in range(rounds):
        names = list(arms) if round_index % 2 == 0 else list(reversed(arms))
        for name in names:
            started = time.perf_counter()
            tokens = arms[name]()
            rates[name].append(tokens / (time.perf_counter() - started))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="HF model directory")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=None, help="cpu, cuda (default: cuda if any)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--group-size", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import torch

    from libra.models.hf import default_device, load_causal_lm, load_tokenizer
    from services.rollout.torch_engine import TorchEngine

    torch.set_num_threads(args.threads)
    device = args.device or default_device()
    model = load_causal_lm(args.model, dtype=args.dtype, device=device)
    tokenizer = load_tokenizer(args.model)
    engine = TorchEngine(model, pad_token_id=tokenizer.pad_token_id, num_threads=args.threads,
                         decode=tokenizer.decode)
    rows = []
    for batch in [int(b) for b in args.batches.split(",")]:
        prompts = _prompts(tokenizer, batch, args.group_size)
        arms = {
            "engine": lambda p=prompts: _run_engine(engine, p, args.new_tokens,
                                                    args.temperature, seed=0),
            "generate": lambda p=prompts: _run_generate(model, tokenizer, p, args.new_tokens,
                                                        args.temperature),
        }
        _run_engine(engine, prompts, 2, args.temperature, seed=0)  # warm-up
        _run_generate(model, tokenizer, prompts, 2, args.temperature)
        rates = _measure(arms, args.rounds)
        engine_rate, generate_rate = (statistics.median(rates[n]) for n in arms)
        rows.append({"batch": batch, "engine_tokens_per_s": round(engine_rate, 1),
                     "generate_tokens_per_s": round(generate_rate, 1),
                     "ratio": round(engine_rate / generate_rate, 3),
                     "prompt_tokens_max": max(len(p) for p in prompts)})
    out = {"model": args.model, "device": device, "dtype": str(model.dtype),
           "threads": args.threads, "new_tokens": args.new_tokens, "rounds": args.rounds,
           "temperature": args.temperature, "group_size": args.group_size, "results": rows}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{args.model} on {device} ({model.dtype}, {args.threads} thread(s)), "
          f"{args.new_tokens} new tokens, T={args.temperature}, group size {args.group_size}, "
          f"median of {args.rounds}")
    print(f"{'batch':>5} {'engine tok/s':>13} {'generate tok/s':>15} {'ratio':>7}")
    for row in rows:
        print(f"{row['batch']:>5} {row['engine_tokens_per_s']:>13.1f} "
              f"{row['generate_tokens_per_s']:>15.1f} {row['ratio']:>6.2f}x")


if __name__ == "__main__":
    main()
