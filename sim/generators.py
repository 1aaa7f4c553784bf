"""Seeded synthetic traces for three agentic shapes, with drift across steps.

The shapes encode the paper's premise (design digest section 2): tool outcomes drive
the continuation. A failure or a large payload makes the next turn longer and the
episode less likely to stop, so a trajectory's remaining length is predictable from
its tool-return path (what C-MLFQ learns) but not from its prompt length.

- ``r2e``: R2E-Gym-like issue writing with an issue validator: up to 12 turns, 32K
  context, heavy-tailed outputs, large test-log payloads on failure, validator
  latencies of seconds (timeouts at 60 s).
- ``search``: Search-R1-like: up to 5 turns of short reasoning plus web search
  (about a second per call, 600-1,500-token results).
- ``math``: DAPO-Math-like: one long reasoning turn, a math validator (tens of ms),
  then a short final turn on success or a long retry on failure.

Drift: lengths and turn counts grow with the step (the policy learns to think longer
and to call tools more), controlled by ``drift_per_step``, or by ``length_growth`` (the
drift multiplier at the last step; the drift variants ``*-drift`` grow 2-3x over the
run, as response lengths do in real RL: DAPO, Yu et al. 2025, and DeepSeek-R1 report
mean response lengths rising several-fold during training).

The numbers are synthetic shapes, not measurements; they are chosen to be in the range
the reference configs imply (32K context, 12 / 5 / 2 turns, 30K new tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.trace import ToolCall, TraceTrajectory, Turn

SHAPES = ("r2e", "search", "math")
DRIFT_VARIANTS: dict[str, tuple[str, float]] = {
    "r2e-drift": ("r2e", 3.5),
    "search-drift": ("search", 2.5),
    "math-drift": ("math", 3.5),
}
"""Workload variant -> (shape, drift multiplier at the last step). Per-turn lengths are
capped (r2e: 12K-token turns, 30K budget; math: 16K), so the mean post-prompt tokens of
the last two steps over the first two grow less: 2.0x (r2e), 2.0x (search), 2.3x
(math) at 20 steps, seed 0 (``tests/unit/sim/test_drift.py``)."""
MAX_LENGTH_GROWTH = 8.0
"""Past 8x the median r2e turn (700 tokens) reaches its 12K cap and a 30K episode
budget holds two turns: the shape stops being the workload it names."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GeneratorConfig:
    """Size of a generated trace."""

    shape: str
    num_steps: int = 20
    prompts_per_step: int = 16
    samples_per_prompt: int = 4
    dataset_size: int = 8101
    """Prompts to draw from (R2E-Gym V1 has 8,101 rows)."""
    drift_per_step: float = 0.02
    seed: int = 0
    length_growth: float | None = None
    """Drift multiplier at the last step (1 at step 0, linear in between); replaces
    ``drift_per_step``. ``None``: ``1 + drift_per_step x step``."""

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        for name in ("num_steps", "prompts_per_step", "samples_per_prompt", "dataset_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        growth = self.length_growth
        if growth is None:
            return
        if isinstance(growth, bool) or not isinstance(growth, int | float) or not (
            1.0 <= growth <= MAX_LENGTH_GROWTH
        ):
            raise ValueError(
                f"length_growth must be a number in [1, {MAX_LENGTH_GROWTH:g}] (lengths "
                f"grow over the run, at most {MAX_LENGTH_GROWTH:g}x), got {growth!r}"
            )
        if growth > 1.0 and self.num_steps < 2:
            raise ValueError(
                f"length_growth {growth:g} needs num_steps >= 2 to grow over, got "
                f"{self.num_steps}"
            )

    def drift(self, step: int) -> float:
        """The drift multiplier of ``step``."""
        if self.length_growth is None:
            return 1.0 + self.drift_per_step * step
        if self.num_steps < 2:
            return 1.0
        return 1.0 + (self.length_growth - 1.0) * step / (self.num_steps - 1)


def workload_config(name: str, **fields: object) -> GeneratorConfig:
    """Config of a workload name: a shape (``r2e``) or a drift variant (``r2e-drift``).

    Raises:
        ValueError: Unknown name (the message lists shapes and variants) or bad fields.
    """
    if name in DRIFT_VARIANTS:
        shape, growth = DRIFT_VARIANTS[name]
        return GeneratorConfig(shape=shape, length_growth=growth, **fields)  # type: ignore[arg-type]
    if name in SHAPES:
        return GeneratorConfig(shape=name, **fields)  # type: ignore[arg-type]
    raise ValueError(
        f"unknown workload {name!r}; shapes: {', '.join(SHAPES)}; drift variants: "
        f"{', '.join(DRIFT_VARIANTS)}"
    )


def generate(config: GeneratorConfig) -> list[TraceTrajectory]:
    """Build the trace: ``num_steps x prompts_per_step x samples_per_prompt`` trajectories."""
    rng = np.random.default_rng(config.seed)
    make = {"r2e": _r2e, "search": _search, "math": _math}[config.shape]
    out: list[TraceTrajectory] = []
    for step in range(config.num_steps):
        drift = config.drift(step)
        prompts = rng.choice(config.dataset_size, size=config.prompts_per_step, replace=False)
        for p in prompts:
            prompt_rng = np.random.default_rng([config.seed, int(p)])
            difficulty = float(prompt_rng.lognormal(0.0, 0.5))
            prompt_tokens = _prompt_tokens(config.shape, prompt_rng)
            for k in range(config.samples_per_prompt):
                turns = make(rng, difficulty, drift)
                tid = f"{config.shape}-s{step}-p{int(p)}-k{k}"
                out.append(
                    TraceTrajectory(
                        tid,
                        f"{config.shape}-{int(p)}",
                        f"{step}:{int(p)}",
                        step,
                        prompt_tokens,
                        tuple(turns),
                    )
                )
    return out


def _prompt_tokens(shape: str, rng: np.random.Generator) -> int:
    median, lo, hi = {"r2e": (2500, 800, 8000), "search": (300, 100, 1000), "math": (250, 80, 800)}[
        shape
    ]
    return int(np.clip(rng.lognormal(np.log(median), 0.4), lo, hi))


def _lognorm(rng: np.random.Generator, median: float, sigma: float) -> float:
    return float(rng.lognormal(np.log(median), sigma))


def _close(turns: list[Turn], out: int) -> list[Turn]:
    """Append the final (tool-less) turn."""
    turns.append(Turn(max(1, out)))
    return turns


def _r2e(rng: np.random.Generator, difficulty: float, drift: float) -> list[Turn]:
    budget = 30_000  # new tokens after the prompt (reference R2E configs: 30K)
    turns: list[Turn] = []
    used, boost = 0, 1.0
    for turn in range(12):
        out = int(min(12_000, _lognorm(rng, 700 * difficulty * drift * boost, 0.7)))
        if used + out >= budget or turn == 11:
            return _close(turns, min(out, budget - used))
        u = rng.random()
        if u < 0.05:
            tool = ToolCall("r2e_issue_validator", 40, "timeout", 60.0)
            boost = 1.3
        elif u < 0.05 + min(0.6, 0.25 * difficulty):
            payload = int(min(15_000, _lognorm(rng, 4000, 0.6)))
            tool = ToolCall("r2e_issue_validator", payload, "failure", _lognorm(rng, 8.0, 0.8))
            boost = 1.8
        else:
            tool = ToolCall(
                "r2e_issue_validator",
                int(_lognorm(rng, 300, 0.4)),
                "success",
                _lognorm(rng, 6.0, 0.6),
            )
            boost = 1.0
        if used + out + tool.payload_tokens >= budget:
            return _close(turns, out)
        turns.append(Turn(out, tool))
        used += out + tool.payload_tokens
        # Reward >= 0.5 ends the episode; only a successful validation can get there.
        if tool.status == "success" and rng.random() < 0.45 / (difficulty * drift):
            return _close(turns, int(_lognorm(rng, 200, 0.5)))
    return _close(turns, 100)


def _search(rng: np.random.Generator, difficulty: float, drift: float) -> list[Turn]:
    turns: list[Turn] = []
    for turn in range(5):
        out = int(min(4000, _lognorm(rng, 250 * difficulty * drift, 0.6)))
        if turn == 4 or rng.random() < 0.35 / (difficulty * drift):
            return _close(turns, int(min(4000, _lognorm(rng, 300 * drift, 0.6))))
        u = rng.random()
        if u < 0.02:
            tool = ToolCall("web_search", 20, "timeout", 10.0)
        elif u < 0.07:
            tool = ToolCall("web_search", 30, "failure", _lognorm(rng, 0.8, 0.4))
        else:
            tool = ToolCall(
                "web_search",
                int(np.clip(_lognorm(rng, 900, 0.35), 300, 3000)),
                "success",
                _lognorm(rng, 1.2, 0.5),
            )
        turns.append(Turn(out, tool))
    return _close(turns, 200)


def _math(rng: np.random.Generator, difficulty: float, drift: float) -> list[Turn]:
    first = int(min(16_000, _lognorm(rng, 3000 * difficulty * drift, 0.6)))
    u = rng.random()
    p_fail = min(0.8, 0.3 * difficulty)
    if u < 0.02:
        tool = ToolCall("dapo_math_validator", 20, "timeout", 5.0)
    elif u < 0.02 + p_fail:
        tool = ToolCall("dapo_math_validator", 30, "failure", _lognorm(rng, 0.1, 0.5))
    else:
        tool = ToolCall("dapo_math_validator", 30, "success", _lognorm(rng, 0.1, 0.5))
    if tool.status == "success":
        last = int(_lognorm(rng, 60, 0.4))
    else:
        last = int(min(16_000, _lognorm(rng, 0.7 * first, 0.4)))
    return [Turn(max(1, first), tool), Turn(max(1, last))]
