"""The one-line bottleneck verdict of a running job, from measured idle ratios (pure).

The inputs are the step records the trainer reports (``libra.types.StepRecord``): each
step's wall time split into phases (``rollout_wait``: the trainer idle, waiting for
complete fresh groups; ``recompute`` + ``train``: the trainer busy; ``publish`` +
``reload``: weight sync), and, where a backend measures it, ``tool_s`` in the step's
metrics (seconds the step's trajectories spent waiting on tool calls).

The rule (docs/observability.md, "Bottleneck verdict"), over the last
``WINDOW_STEPS`` timed steps:

1. no step with timings yet -> ``unknown``;
2. shares of the summed wall time: ``idle`` = rollout_wait, ``train`` = recompute +
   train, ``sync`` = publish + reload;
3. the largest share names the side that holds the step back: ``train`` ->
   ``train-bound``, ``sync`` -> ``sync-bound``, ``idle`` -> the rollouts are slower
   than the trainer: ``tool-bound`` when tool waits are at least ``TOOL_SHARE_MIN`` of
   the rollouts' time (``tool_s`` / (rollout_wait + train + ...), reported only), else
   ``rollout-bound``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from libra.job_types import StepRecord

WINDOW_STEPS = 10
"""Recent steps the verdict looks at: long enough to smooth one slow step, short enough
to follow a change of regime within a few steps."""
TOOL_SHARE_MIN = 0.5
"""Tool waits at least this share of the window's wall time make an idle trainer
tool-bound: most of what the rollouts wait on is then the tools, not generation."""

VERDICTS = ("unknown", "rollout-bound", "train-bound", "tool-bound", "sync-bound")


def phase_seconds(record: StepRecord) -> dict[str, float]:
    """The step's time per phase (libra.metrics.STEP_PHASES) that the trainer reported."""
    reported = {
        "rollout_wait": record.rollout_s,
        "recompute": record.metrics.get("recompute_s"),
        "train": record.train_s,
        "publish": record.publish_s,
        "reload": record.metrics.get("reload_s"),
    }
    return {phase: float(s) for phase, s in reported.items() if s is not None}


@dataclass(frozen=True, slots=True)
class Verdict:
    """What holds the job back, with the measured shares it was read from."""

    kind: str
    """One of VERDICTS."""
    line: str
    """The verdict for a person, with its numbers."""
    idle_share: float
    """Trainer idle (waiting for rollouts) / wall time, over the window."""
    train_share: float
    sync_share: float
    tool_share: float | None
    """Tool waits / wall time; None when no step of the window reported ``tool_s``."""
    num_steps: int
    """Timed steps the verdict was read from."""


def timed_window(records: Sequence[StepRecord],
                 window_steps: int = WINDOW_STEPS) -> list[StepRecord]:
    """The last ``window_steps`` records that carry phase timings, oldest first (read
    from the end: a long history costs no more than its tail)."""
    out: list[StepRecord] = []
    for record in reversed(records):
        if len(out) == window_steps:
            break
        if phase_seconds(record):
            out.append(record)
    return out[::-1]


def bottleneck(records: Sequence[StepRecord], window_steps: int = WINDOW_STEPS) -> Verdict:
    """The verdict over the last ``window_steps`` records that carry phase timings."""
    timed = timed_window(records, window_steps)
    if not timed:
        return Verdict("unknown", "unknown: no timed step yet", 0.0, 0.0, 0.0, None, 0)
    sums = {"idle": 0.0, "train": 0.0, "sync": 0.0}
    wall_s, tool_s, has_tool = 0.0, 0.0, False
    for record in timed:
        phases = phase_seconds(record)
        sums["idle"] += phases.get("rollout_wait", 0.0)
        sums["train"] += phases.get("train", 0.0) + phases.get("recompute", 0.0)
        sums["sync"] += phases.get("publish", 0.0) + phases.get("reload", 0.0)
        # A step without wall_s: its phases are all that is known of it.
        wall_s += max(record.wall_s or 0.0, sum(phases.values()))
        if "tool_s" in record.metrics:
            has_tool, tool_s = True, tool_s + float(record.metrics["tool_s"])
    share = {k: (v / wall_s if wall_s > 0 else 0.0) for k, v in sums.items()}
    tool_share = min(1.0, tool_s / wall_s) if has_tool and wall_s > 0 else None
    kind = _kind(share, tool_share)
    return Verdict(kind, _line(kind, share, tool_share, len(timed)), round(share["idle"], 4),
                   round(share["train"], 4), round(share["sync"], 4),
                   None if tool_share is None else round(tool_share, 4), len(timed))


def _kind(share: dict[str, float], tool_share: float | None) -> str:
    # Ties go to the earlier side in this order: an idle trainer is the cheapest to fix
    # (more rollout instances), so it is named first.
    side = max(("idle", "train", "sync"), key=lambda k: share[k])
    if share[side] <= 0.0:
        return "unknown"
    if side == "train":
        return "train-bound"
    if side == "sync":
        return "sync-bound"
    if tool_share is not None and tool_share >= TOOL_SHARE_MIN:
        return "tool-bound"
    return "rollout-bound"


def _line(kind: str, share: dict[str, float], tool_share: float | None,
          num_steps: int) -> str:
    ratios = (f"trainer idle {share['idle']:.0%}, training {share['train']:.0%}, "
              f"weight sync {share['sync']:.0%}")
    if tool_share is not None:
        ratios += f", tool waits {tool_share:.0%}"
    why = {
        "rollout-bound": "the trainer waits for rollouts",
        "tool-bound": "the trainer waits for rollouts, which wait on tools",
        "train-bound": "rollouts wait for the trainer",
        "sync-bound": "publishing and reloading weights dominate",
        "unknown": "no phase time measured",
    }[kind]
    return f"{kind}: {why} ({ratios}; last {num_steps} steps)"
