"""Built-in text rewards: ``exact_match`` and ``numeric`` (math equivalence).

``numeric`` parses ints, decimals, scientific notation, fractions ("3/4"), and strips
"$", ",", "%" and surrounding text like "The answer is 42."; it compares the *last*
number in the final text (where chain-of-thought answers end) within a tolerance.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import TYPE_CHECKING

from services.toolgateway.rewards.base import RewardOutput

if TYPE_CHECKING:
    from services.toolgateway.rewards.base import ScoreRequest

_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*-?\d+(?:\.\d+)?)?")


def normalize_text(text: str) -> str:
    """Lowercase, trim, collapse whitespace, drop trailing period."""
    return " ".join(text.strip().lower().split()).rstrip(".")


def parse_number(text: str) -> float | None:
    """Parse the last number (or fraction) in ``text``; None if there is none."""
    cleaned = text.replace(",", "").replace("$", "").replace("%", "")
    matches = _NUMBER_RE.findall(cleaned)
    if not matches:
        return None
    token = matches[-1].replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return float(Fraction(num) / Fraction(den))
        return float(token)
    except (ValueError, ZeroDivisionError):
        return None


class ExactMatchReward:
    """1.0 when the normalized final text equals the normalized reference."""

    name = "exact_match"
    description = "Normalized string equality with the reference."

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """Compare after ``normalize_text``."""
        is_equal = normalize_text(request.final_text) == normalize_text(request.reference)
        return RewardOutput(reward=1.0 if is_equal else 0.0)


class NumericReward:
    """1.0 when the last number in the text equals the reference within tolerance."""

    name = "numeric"
    description = "Math equivalence of the final number (ints, floats, fractions)."

    def __init__(self, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> None:
        self._rel_tol = rel_tol
        self._abs_tol = abs_tol

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """Parse both sides and compare with ``math.isclose``."""
        got, want = parse_number(request.final_text), parse_number(request.reference)
        if got is None or want is None:
            return RewardOutput(reward=0.0, details={"parsed": got, "expected": want})
        is_close = math.isclose(got, want, rel_tol=self._rel_tol, abs_tol=self._abs_tol)
        return RewardOutput(reward=1.0 if is_close else 0.0,
                            details={"parsed": got, "expected": want})
