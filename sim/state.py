"""Runtime state the event loop keeps per run: the simulated clock and each trajectory."""

from __future__ import annotations

from dataclasses import dataclass

from sim.trace import TraceTrajectory


class SimClock:
    """Simulated time for policies that read a clock (``la_mlfq`` scouts)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now_s(self) -> float:
        return self.t

    def now_ms(self) -> int:
        return int(self.t * 1000)


@dataclass(slots=True)
class TrajState:
    """Runtime state of one trace trajectory."""

    rec: TraceTrajectory
    index: int
    turn: int = 0
    post_tokens: int = 0
    instance: str = ""
    released_s: float = -1.0
    finished_s: float = -1.0
    placed: bool = False
    needs_full_prefill: bool = True
    in_tool: bool = False
    first_version: int = -1
    """Policy version of the oldest model token (-1: not started)."""
    last_version: int = -1
    """Policy version of the newest model token: a weight update landing while a turn
    generates (partial rollout) or before the next turn moves it on."""
    partial_tokens: int = 0
    """Tokens of the current turn already generated and kept when its instance was torn
    down under the ``migrate`` move (``sim.moves``): the turn resumes elsewhere from
    them, prefilling them with its context, and decodes only the rest."""

    @property
    def ctx(self) -> int:
        return self.rec.prompt_tokens + self.post_tokens
