"""``llm_judge`` reward: an OpenAI-compatible ``/v1/chat/completions`` endpoint scores.

The judge is a remote, rate-limited service (field notes item 23), so calls go through a
token bucket (requests per second with a burst) and carry a timeout. The reply must
contain a score in [0, 1] ("0.8", "Score: 1", "score=0.25"); the last such number wins.
HTTP errors, timeouts and unparsable replies raise ``Unavailable`` (retryable): a
missing judgement must not silently become reward 0.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx

from services.toolgateway.errors import Unavailable
from services.toolgateway.rewards.base import RewardOutput

if TYPE_CHECKING:
    from services.toolgateway.core import ScoreRequest

_SCORE_RE = re.compile(r"(?<![\d.])(?:0(?:\.\d+)?|1(?:\.0+)?)(?![\d.])")
_PROMPT = (
    "Grade the answer against the reference. Reply with a single score between 0 and 1.\n"
    "Question/context: {context}\nReference: {reference}\nAnswer: {answer}\nScore:"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class LlmJudgeConfig:
    """Endpoint and limits of the judge."""

    base_url: str
    """Server root, e.g. ``http://judge:8000`` (``/v1/chat/completions`` is appended)."""
    model: str
    """Model name sent in the request body."""
    api_key: str = ""
    """Bearer token, if the endpoint needs one (never logged)."""
    timeout_s: float = 30.0
    """Per-request timeout."""
    requests_per_s: float = 5.0
    """Token-bucket refill rate."""
    burst: int = 5
    """Token-bucket capacity."""
    max_tokens: int = 16
    """Completion length limit sent to the judge."""

    def __post_init__(self) -> None:
        if self.requests_per_s <= 0 or self.burst < 1:
            raise ValueError(f"requests_per_s must be > 0 and burst >= 1, got "
                             f"{self.requests_per_s} / {self.burst}")


class TokenBucket:
    """Async token bucket: ``acquire`` waits until a token is available."""

    def __init__(self, rate_per_s: float, capacity: int, clock=time.monotonic) -> None:
        self._rate_per_s = rate_per_s
        self._capacity = float(capacity)
        self._tokens = float(capacity)
        self._clock = clock
        self._last_s = clock()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Take one token, sleeping for the refill if the bucket is empty."""
        async with self._lock:  # serialise waiters so they are served in order
            self._refill()
            if self._tokens < 1.0:
                await asyncio.sleep((1.0 - self._tokens) / self._rate_per_s)
                self._refill()
            self._tokens -= 1.0

    def _refill(self) -> None:
        now_s = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now_s - self._last_s) * self._rate_per_s)
        self._last_s = now_s


def parse_score(text: str) -> float | None:
    """The last number in [0, 1] in ``text``, or None."""
    matches = _SCORE_RE.findall(text)
    return float(matches[-1]) if matches else None


class LlmJudgeReward:
    """Asks an LLM to grade the final text against the reference."""

    name = "llm_judge"
    description = "LLM-as-judge score in [0, 1] via an OpenAI-compatible endpoint."

    def __init__(self, config: LlmJudgeConfig, client: httpx.AsyncClient | None = None):
        self._config = config
        self._bucket = TokenBucket(config.requests_per_s, config.burst)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._client = client or httpx.AsyncClient(
            base_url=config.base_url, timeout=config.timeout_s, headers=headers)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """One rate-limited judge call."""
        await self._bucket.acquire()
        prompt = _PROMPT.format(context=request.extra.get("question", ""),
                                reference=request.reference, answer=request.final_text)
        body = {"model": self._config.model, "temperature": 0.0,
                "max_tokens": self._config.max_tokens,
                "messages": [{"role": "user", "content": prompt}]}
        try:
            resp = await self._client.post("/v1/chat/completions", json=body)
            resp.raise_for_status()
            content = resp.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise Unavailable(f"llm judge failed: {type(exc).__name__}: {exc}") from exc
        score = parse_score(content or "")
        if score is None:
            raise Unavailable(f"llm judge reply has no score in [0, 1]: {content[:80]!r}")
        return RewardOutput(reward=score, details={"judge_reply": content[:200]})
