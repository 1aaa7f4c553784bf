"""``code_tests`` reward: run candidate code plus unit tests in the sandbox.

The reference (or ``extra["tests"]``) is a list of Python assert statements, one per
line or given as a list. They run after the candidate in one sandboxed script; each test
is wrapped so one failure does not hide the rest. The reward is the fraction of tests
that passed (or 0/1 with ``mode="all"``). The test harness prints a result line with a
random marker so candidate output cannot forge it.
"""

from __future__ import annotations

import json
import secrets
from typing import TYPE_CHECKING

from libra.types import ToolStatus
from services.toolgateway.rewards.base import RewardOutput
from services.toolgateway.sandbox import Sandbox

if TYPE_CHECKING:
    from services.toolgateway.rewards.base import ScoreRequest

_HARNESS = """
def __libra_run_tests(tests, marker):
    passed = 0
    for t in tests:
        try:
            exec(t, globals())
            passed += 1
        except BaseException:
            pass
    print(marker, passed, flush=True)
__libra_run_tests({tests}, {marker!r})
"""


def _strip_fence(text: str) -> str:
    """Take the code out of a markdown fence if the answer has one."""
    if "```" not in text:
        return text
    body = text.split("```", 2)[1]
    return body.split("\n", 1)[1] if "\n" in body else body


class CodeTestsReward:
    """Fraction (or all-or-nothing) of unit tests the candidate passes."""

    name = "code_tests"
    description = "Run the candidate with assert-style tests in the sandbox."

    def __init__(self, sandbox: Sandbox, timeout_s: float = 10.0, mode: str = "fraction"):
        if mode not in ("fraction", "all"):
            raise ValueError(f"code_tests mode must be 'fraction' or 'all', got {mode!r}")
        self._sandbox = sandbox
        self._timeout_s = timeout_s
        self._mode = mode

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """Run candidate + tests; a crash or timeout scores what was reported (or 0)."""
        tests = request.extra.get("tests") or [
            line for line in request.reference.splitlines() if line.strip()]
        marker = "LIBRA-RESULT-" + secrets.token_hex(8)
        harness = _HARNESS.format(tests=json.dumps(list(tests)), marker=marker)
        code = _strip_fence(request.final_text) + "\n" + harness
        result = await self._sandbox.run(code, timeout_s=self._timeout_s)
        passed = _parse_passed(result.stdout, marker)
        total = max(len(tests), 1)
        fraction = passed / total
        reward = fraction if self._mode == "fraction" else float(passed == len(tests) > 0)
        return RewardOutput(reward=reward, details={
            "passed": passed, "total": len(tests), "status": result.status.value,
            "error": result.error if result.status is not ToolStatus.SUCCESS else ""})


def _parse_passed(stdout: str, marker: str) -> int:
    for line in reversed(stdout.splitlines()):
        if line.startswith(marker + " "):
            return int(line.split()[1])
    return 0
