"""The project's CPU rollout engine as a simulated instance: measured step costs.

The torch engine (``services/rollout/torch_engine.py``) is *turn-batched*, unlike the
continuous-batching GPU instances of ``sim/instance.py``: one ``generate`` call takes a
batch of rows, left-pads their full contexts (no prefix cache: a fresh KV cache per call),
runs one prefill forward, then one decode forward per further token until the longest
row of the batch ends its turn (finished rows are fed padding). New work joins at the
next call. Its costs are not a roofline (a 2-layer, 128-wide model is dominated by
per-forward Python and per-row sampling overhead), so they are **measured**:
:func:`calibrate` times ``TorchEngine.generate`` on the job's own model over a grid of
batch sizes, context lengths and token counts, and fits by least squares

    prefill_s(B, L)     = p0 + p1 * B * L             (one forward over B x L tokens)
    decode_step_s(B, c) = d0 + d1 * B + d2 * B * c    (one token for B rows, context c)

No constant here is chosen by hand: every coefficient comes from a timing run.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class CpuEngineCosts:
    """Measured step costs of one CPU rollout instance (seconds)."""

    prefill_base_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_row_s: float
    decode_per_row_ctx_s: float
    source: str = "measured"

    def prefill_s(self, batch: int, padded_len: int) -> float:
        """One prefill forward over ``batch`` rows left-padded to ``padded_len``."""
        return self.prefill_base_s + self.prefill_per_token_s * batch * padded_len

    def decode_steps_s(self, batch: int, ctx_start: int, num_steps: int) -> float:
        """``num_steps`` decode forwards for ``batch`` rows from context ``ctx_start``."""
        if num_steps <= 0:
            return 0.0
        ctx_sum = num_steps * ctx_start + num_steps * (num_steps - 1) / 2.0
        per_step = self.decode_base_s + self.decode_per_row_s * batch
        return num_steps * per_step + self.decode_per_row_ctx_s * batch * ctx_sum

    def call_s(self, prompt_lens: list[int], output_lens: list[int]) -> float:
        """One ``generate`` call: prefill, then decode until the longest turn ends."""
        batch, padded = len(prompt_lens), max(prompt_lens)
        longest = max(output_lens)
        return self.prefill_s(batch, padded) + self.decode_steps_s(batch, padded, longest - 1)

    def scaled(self, factor: float) -> CpuEngineCosts:
        """The same engine given ``1 / factor`` of a core (processor sharing)."""
        return CpuEngineCosts(
            self.prefill_base_s * factor, self.prefill_per_token_s * factor,
            self.decode_base_s * factor, self.decode_per_row_s * factor,
            self.decode_per_row_ctx_s * factor, f"{self.source} x {factor:.2f} (CPU share)",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fit(samples: list[dict[str, float]]) -> CpuEngineCosts:
    """Least-squares fit of the cost model to timed calls.

    Each sample: ``batch``, ``prompt_len``, ``new_tokens`` and ``call_s`` (the wall time
    of one call where every row ran exactly ``new_tokens`` tokens). Coefficients are
    clipped at 0 (a negative cost is noise, not physics).
    """
    rows, y = [], []
    for s in samples:
        b, length, n = s["batch"], s["prompt_len"], s["new_tokens"]
        steps = n - 1
        ctx_sum = steps * length + steps * (steps - 1) / 2.0
        rows.append([1.0, b * length, steps, steps * b, b * ctx_sum])
        y.append(s["call_s"])
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(y), rcond=None)
    c = [max(0.0, float(v)) for v in coef]
    return CpuEngineCosts(c[0], c[1], c[2], c[3], c[4])


CALIBRATION_GRID = {
    "batch": (1, 2, 4, 8),
    "prompt_len": (8, 48, 112),
    "new_tokens": (1, 12, 24),
}
"""Shapes timed by :func:`calibrate`: the demo's batch caps, contexts and turn budget."""


def time_calls(model_dir: str, repeats: int = 3, num_threads: int = 1) -> list[dict[str, float]]:
    """Time ``TorchEngine.generate`` on the model in ``model_dir`` over the grid.

    Rows never stop early (no stop tokens), so each call runs exactly ``new_tokens``.
    The median of ``repeats`` timings is kept per shape (robust to a noisy neighbour).
    """
    from libra.models.tiny import load_model_dir
    from services.rollout.engine_types import GenerationRequest
    from services.rollout.torch_engine import TorchEngine

    model, tokenizer = load_model_dir(model_dir)
    engine = TorchEngine(model, pad_token_id=tokenizer.pad_token_id, num_threads=num_threads)
    vocab = int(model.config.vocab_size)
    rng = np.random.default_rng(0)
    out = []
    grid = CALIBRATION_GRID
    engine.generate([GenerationRequest(prompt_token_ids=[1, 2, 3], max_new_tokens=4)])  # warm
    for b in grid["batch"]:
        for length in grid["prompt_len"]:
            for n in grid["new_tokens"]:
                reqs = [
                    GenerationRequest(
                        prompt_token_ids=rng.integers(4, vocab, length).tolist(), max_new_tokens=n
                    )
                    for _ in range(b)
                ]
                times = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    engine.generate(reqs)
                    times.append(time.perf_counter() - started)
                out.append(
                    {"batch": b, "prompt_len": length, "new_tokens": n,
                     "call_s": float(np.median(times))}
                )
    return out


def calibrate(model_dir: str, repeats: int = 3) -> tuple[CpuEngineCosts, dict[str, Any]]:
    """Measure and fit; also return the fit's relative error over the timed shapes."""
    samples = time_calls(model_dir, repeats)
    costs = fit(samples)
    errs = [
        costs.call_s([int(s["prompt_len"])] * int(s["batch"]), [int(s["new_tokens"])])
        / s["call_s"] - 1.0
        for s in samples
    ]
    return costs, {
        "num_shapes": len(samples),
        "fit_mean_abs_rel_err": float(np.mean(np.abs(errs))),
        "fit_max_abs_rel_err": float(np.max(np.abs(errs))),
        "total_timed_s": float(sum(s["call_s"] for s in samples) * repeats),
    }
