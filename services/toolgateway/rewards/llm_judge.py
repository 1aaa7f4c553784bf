"""``llm_judge`` reward: an OpenAI-compatible ``/v1/chat/completions`` endpoint scores.

The judge is a remote, rate-limited service (field notes item 23), so calls go through a
token bucket (requests per second with a burst) and carry a timeout. The reply must
contain a score in [0, 1] ("0.8", "Score: 1", "score=0.25"); the last such number wins.
HTTP errors, timeouts and unparsable replies raise ``Unavailable`` (retryable): a
missing judgement must not silently become reward 0.

Per job: the spec's ``[reward.llm_judge]`` arrives in the request's
``options["llm_judge"]`` (endpoint, model, prompt template, rate, timeout, and the *name*
of the environment variable holding the API key, read here on the gateway); one HTTP
client and token bucket is kept per distinct setting. Without it the gateway's own
``LlmJudgeConfig`` (if any) is used, else the call fails naming the missing section.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from libra.config import env_flag
from services.toolgateway.errors import Unavailable
from services.toolgateway.rewards.base import RewardContractError, RewardOutput

if TYPE_CHECKING:
    from services.toolgateway.rewards.base import ScoreRequest

_SCORE_RE = re.compile(r"(?<![\d.])(?:0(?:\.\d+)?|1(?:\.0+)?)(?![\d.])")
_PROMPT = (
    "Grade the answer against the reference. Reply with a single score between 0 and 1.\n"
    "Question/context: {question}\nReference: {reference}\nAnswer: {answer}\nScore:"
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
    prompt_template: str = ""
    """``str.format`` text with {question}, {reference}, {answer}, {transcript}; empty:
    the built-in grading prompt."""

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


def config_from_options(options: dict[str, Any]) -> LlmJudgeConfig:
    """A job's ``[reward.llm_judge]`` (as sent in the Score options) as a config; the API
    key is read from the environment variable the spec names."""
    raw = dict(options)
    key_env = raw.pop("api_key_env", "")
    fields = {f.name for f in dataclasses.fields(LlmJudgeConfig)}
    kwargs = {k: v for k, v in raw.items() if k in fields and k != "api_key"}
    kwargs["burst"] = max(1, int(kwargs.get("requests_per_s", 5.0)))
    return LlmJudgeConfig(api_key=env_flag(key_env) if key_env else "", **kwargs)


def _transcript_text(request: ScoreRequest) -> str:
    return "\n".join(f"{m.role}{'(' + m.name + ')' if m.name else ''}: {m.content}"
                     for m in request.messages)


def _question(request: ScoreRequest) -> str:
    users = [m.content for m in request.messages if m.role == "user"]
    return request.extra.get("question", "") or (users[0] if users else "")


class _Judge:
    """One endpoint setting: its HTTP client and rate limit."""

    def __init__(self, config: LlmJudgeConfig, client: httpx.AsyncClient | None = None):
        self.config = config
        self.bucket = TokenBucket(config.requests_per_s, config.burst)
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.client = client or httpx.AsyncClient(
            base_url=config.base_url, timeout=config.timeout_s, headers=headers)


class LlmJudgeReward:
    """Asks an LLM to grade the final text against the reference (always registered; a
    job configures its endpoint in ``[reward.llm_judge]``)."""

    name = "llm_judge"
    description = "LLM-as-judge score in [0, 1] via an OpenAI-compatible endpoint."

    def __init__(self, config: LlmJudgeConfig | None = None,
                 client: httpx.AsyncClient | None = None):
        self._default = None if config is None else _Judge(config, client)
        self._per_job: dict[str, _Judge] = {}

    async def aclose(self) -> None:
        """Close the HTTP clients."""
        for judge in [self._default, *self._per_job.values()]:
            if judge is not None:
                await judge.client.aclose()

    def _judge_for(self, request: ScoreRequest) -> _Judge:
        options = request.options.get("llm_judge")
        if options:
            key = json.dumps(options, sort_keys=True)
            if key not in self._per_job:
                self._per_job[key] = _Judge(config_from_options(options))
            return self._per_job[key]
        if self._default is None:
            raise RewardContractError("llm_judge has no endpoint: set [reward.llm_judge] "
                                      "base_url and model in the job spec")
        return self._default

    async def score(self, request: ScoreRequest) -> RewardOutput:
        """One rate-limited judge call."""
        judge = self._judge_for(request)
        await judge.bucket.acquire()
        template = judge.config.prompt_template or _PROMPT
        prompt = template.format(question=_question(request), reference=request.reference,
                                 answer=request.final_text,
                                 transcript=_transcript_text(request))
        body = {"model": judge.config.model, "temperature": 0.0,
                "max_tokens": judge.config.max_tokens,
                "messages": [{"role": "user", "content": prompt}]}
        try:
            resp = await judge.client.post("/v1/chat/completions", json=body)
            resp.raise_for_status()
            content = resp.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise Unavailable(f"llm judge failed: {type(exc).__name__}: {exc}") from exc
        score = parse_score(content or "")
        if score is None:
            raise Unavailable(f"llm judge reply has no score in [0, 1]: {content[:80]!r}")
        return RewardOutput(reward=score, details={"judge_reply": content[:200]})
