"""Tool gateway core: executes tool calls for rollout workers and scores trajectories.

Request flow: servicer -> ``ToolGatewayCore.execute(ToolCall)`` -> registry lookup and
JSON-schema check -> per-tool lane (concurrency slots + bounded wait queue) -> tool
``run`` under min(tool timeout, caller deadline), retried only for idempotent tools ->
``ToolResult`` with the causal ``ToolReturnState`` (tool type, size class, status).

Classification rules:

* Status: success when the tool says ok; timeout when the tool hit its time limit, the
  caller's deadline cut it short, or the core's backstop fired; failure otherwise
  (including a tool that raised).
* Payload tokens: ``token_counter`` applied to the text the model will see, i.e. the
  (truncated) output plus the error message. The default counter estimates
  ceil(chars / 4), the usual English-text average for BPE tokenizers; inject the
  policy's tokenizer for exact counts.
* Size class: ``SizeThresholds.classify(payload_tokens)``: <= small_max_tokens is small,
  <= medium_max_tokens medium, else large.

Retries: only for tools declared idempotent, only for infrastructure faults (the tool
raised, or returned ``is_transient``), with exponential backoff, and never past the
deadline. Timeouts are not retried: a slow call rarely gets faster and would burn the
caller's budget. Model-facing failures ("syntax", "busy") are returned as they are.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from libra.errors import DeadlineExceeded, Internal, LibraError
from libra.tool_deadline import BACKSTOP_GRACE_S
from libra.types import SizeThresholds, ToolResult, ToolReturnState, ToolStatus
from services.toolgateway.errors import ToolBusy
from services.toolgateway.rewards.base import RewardContractError, ScoreRequest, check_output
from services.toolgateway.rewards.composite import composite_weights
from services.toolgateway.rewards.registry import RewardRegistry
from services.toolgateway.tools.base import Tool, ToolContext, ToolOutput
from services.toolgateway.tools.registry import ToolRegistry

logger = logging.getLogger(__name__)
TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """Default token counter: ceil(chars / 4)."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolGatewayLimits:
    """Concurrency, retry and output limits of the core."""

    max_concurrency_per_tool: int = 8
    """Calls of one tool running at once."""
    max_queue_depth_per_tool: int = 64
    """Calls of one tool waiting for a slot; beyond it calls get ToolBusy (ResourceExhausted)."""
    tool_max_concurrency: Mapping[str, int] = field(default_factory=dict)
    """Per-tool overrides of ``max_concurrency_per_tool``."""
    max_output_chars: int = 65536
    """Tool output beyond this is cut and marked."""
    max_attempts: int = 3
    """Attempts per call of an idempotent tool (1 = no retry)."""
    retry_backoff_initial_ms: int = 50
    """First backoff; doubles per attempt."""
    retry_backoff_max_ms: int = 1000
    """Backoff cap."""
    timeout_grace_ms: int = int(BACKSTOP_GRACE_S * 1000)
    """Extra time before the core's own backstop cancels a tool that ignores its timeout
    (a caller's RPC deadline leaves room for the default: libra/tool_deadline.py)."""
    max_retry_after_ms: int = 10000
    """Upper bound of the retry-after hint."""
    reward_timeout_s: float = 30.0
    """Longest one Score may take when the job sets no ``reward.timeout_s``."""
    size_thresholds: SizeThresholds = field(default_factory=SizeThresholds)
    """Token thresholds of the size classes."""

    def __post_init__(self) -> None:
        if self.max_concurrency_per_tool < 1 or self.max_queue_depth_per_tool < 0:
            raise ValueError("max_concurrency_per_tool must be >= 1 and "
                             "max_queue_depth_per_tool >= 0, got "
                             f"{self.max_concurrency_per_tool} / {self.max_queue_depth_per_tool}")
        if self.max_attempts < 1 or self.max_output_chars < 1:
            raise ValueError(f"max_attempts and max_output_chars must be >= 1, got "
                             f"{self.max_attempts} / {self.max_output_chars}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call from a rollout worker."""

    trajectory_id: str
    call_id: str
    tool: str
    args: dict[str, Any]
    deadline_ms: int | None = None
    """Caller's remaining budget in ms when the call arrives; None means no deadline."""
    options: dict[str, Any] = field(default_factory=dict)
    """Job-level settings of the tool (from the job spec), overriding the gateway's."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a rollout worker needs to know to offer a tool to the model."""

    name: str
    description: str
    args_schema: dict[str, Any]
    idempotent: bool
    timeout_s: float


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """A reward, its named components, and the reward's details."""

    trajectory_id: str
    reward: float
    details: dict[str, Any] = field(default_factory=dict)
    components: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RewardInfo:
    """A registered reward as ListRewards reports it."""

    name: str
    description: str


@dataclass(frozen=True, slots=True)
class LaneStats:
    """One tool's lane at one moment."""

    tool: str
    num_running: int
    num_waiting: int
    limit: int


class _ToolLane:
    """Concurrency slots plus a bounded wait queue for one tool."""

    def __init__(self, limit: int, queue_depth: int) -> None:
        self.limit = limit
        self.queue_depth = queue_depth
        self.num_waiting = 0
        self.num_running = 0
        self.ewma_latency_ms = 100.0  # prior until calls are observed
        self._slots = asyncio.Semaphore(limit)

    def retry_after_ms(self, cap_ms: int) -> int:
        """Rough time until a queue position frees: queue length x latency / slots."""
        estimate_ms = self.ewma_latency_ms * (self.num_waiting + 1) / self.limit
        return max(1, min(cap_ms, math.ceil(estimate_ms)))

    async def acquire(self, tool: str, timeout_s: float | None, cap_ms: int) -> None:
        if not self._slots.locked():
            # A free slot is taken without suspending, so calls arriving in the same
            # event-loop tick see the updated count (wait_for would defer it to a task).
            await self._slots.acquire()
            self.num_running += 1
            return
        if self.num_waiting >= self.queue_depth:
            raise ToolBusy(f"tool {tool!r}: {self.limit} running and "
                           f"{self.num_waiting} queued", self.retry_after_ms(cap_ms))
        self.num_waiting += 1
        try:
            async with asyncio.timeout(timeout_s):
                await self._slots.acquire()
        except TimeoutError:
            raise DeadlineExceeded(f"tool {tool!r}: deadline passed while queued") from None
        finally:
            self.num_waiting -= 1
        self.num_running += 1

    def release(self, latency_ms: float) -> None:
        self.ewma_latency_ms = 0.8 * self.ewma_latency_ms + 0.2 * latency_ms
        self.num_running -= 1
        self._slots.release()


class ToolGatewayCore:
    """Executes tool calls and scores trajectories; no transport, no process handling."""

    def __init__(
        self,
        tools: ToolRegistry,
        rewards: RewardRegistry,
        limits: ToolGatewayLimits | None = None,
        *,
        token_counter: TokenCounter = estimate_tokens,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._tools = tools
        self._rewards = rewards
        self._limits = limits or ToolGatewayLimits()
        self._count_tokens = token_counter
        self._clock = clock
        self._sleep = sleep
        self._init_lanes()

    def _init_lanes(self) -> None:
        lim = self._limits
        self._lanes = {
            name: _ToolLane(lim.tool_max_concurrency.get(name, lim.max_concurrency_per_tool),
                            lim.max_queue_depth_per_tool)
            for name in self._tools.names()
        }

    @property
    def backstop_grace_s(self) -> float:
        """How long past a call's budget the backstop lets a tool run (``timeout_grace_ms``)."""
        return self._limits.timeout_grace_ms / 1000

    def lane_stats(self) -> list[LaneStats]:
        """Per tool: calls running and waiting now, and the slot limit (metrics)."""
        return [LaneStats(name, lane.num_running, lane.num_waiting, lane.limit)
                for name, lane in sorted(self._lanes.items())]

    def list_tools(self) -> list[ToolSpec]:
        """Specs of all registered tools, sorted by name."""
        return [ToolSpec(t.name, t.description, t.args_schema, t.idempotent, t.timeout_s)
                for t in sorted(self._tools, key=lambda t: t.name)]

    async def execute(self, call: ToolCall) -> ToolResult:
        """Run one tool call.

        Raises:
            UnknownTool: The tool is not registered (the message lists known tools).
            InvalidArgument: ``args`` fail the tool's schema (``field`` names the field).
            ToolBusy: (a ResourceExhausted) All slots and queue positions of the tool are taken.
            DeadlineExceeded: The deadline passed before the tool could start.
        """
        tool = self._tools.get(call.tool)
        self._tools.validate_args(call.tool, call.args)
        start_s = self._clock()
        deadline_s = self._deadline_s(call, start_s)
        lane = self._lanes[tool.name]
        cap_ms = self._limits.max_retry_after_ms
        await lane.acquire(tool.name, self._remaining_s(deadline_s), cap_ms)
        try:
            output, num_attempts = await self._run_with_retries(tool, call, deadline_s)
        finally:
            latency_ms = (self._clock() - start_s) * 1000
            lane.release(latency_ms)
        return self._make_result(call, output, num_attempts, int(latency_ms))

    def _deadline_s(self, call: ToolCall, start_s: float) -> float | None:
        if call.deadline_ms is None:
            return None
        if call.deadline_ms <= 0:
            raise DeadlineExceeded(f"call {call.call_id!r} arrived with no time left")
        return start_s + call.deadline_ms / 1000

    def _remaining_s(self, deadline_s: float | None) -> float | None:
        return None if deadline_s is None else deadline_s - self._clock()

    async def _run_with_retries(self, tool: Tool, call: ToolCall,
                                deadline_s: float | None) -> tuple[ToolOutput, int]:
        lim = self._limits
        max_attempts = lim.max_attempts if tool.idempotent else 1
        for attempt in range(1, max_attempts + 1):
            remaining_s = self._remaining_s(deadline_s)
            timeout_s = tool.timeout_s if remaining_s is None else min(tool.timeout_s, remaining_s)
            if timeout_s <= 0:
                return ToolOutput(ok=False, error="timeout", is_timeout=True), attempt - 1
            output = await self._run_once(tool, call, timeout_s, attempt)
            if output.ok or not output.is_transient or attempt == max_attempts:
                return output, attempt
            backoff_s = min(lim.retry_backoff_initial_ms * 2 ** (attempt - 1),
                            lim.retry_backoff_max_ms) / 1000
            remaining_s = self._remaining_s(deadline_s)
            if remaining_s is not None and backoff_s >= remaining_s:
                return output, attempt  # a retry could not finish in time
            await self._sleep(backoff_s)
        raise AssertionError("unreachable: the loop returns on its last attempt")

    async def _run_once(self, tool: Tool, call: ToolCall, timeout_s: float,
                        attempt: int) -> ToolOutput:
        ctx = ToolContext(call.trajectory_id, call.call_id, timeout_s, attempt, call.options)
        backstop_s = timeout_s + self._limits.timeout_grace_ms / 1000
        try:
            # The tool enforces timeout_s itself (the sandbox kills its process group);
            # this backstop only catches tools that ignore it.
            async with asyncio.timeout(backstop_s):
                return await tool.run(call.args, ctx)
        except TimeoutError:
            return ToolOutput(ok=False, error="timeout", is_timeout=True)
        except Exception as exc:  # noqa: BLE001 - a plugin fault becomes a failed call
            logger.warning("[tool] tool=%s call_id=%s attempt=%d raised %s: %s",
                           tool.name, call.call_id, attempt, type(exc).__name__, exc)
            return ToolOutput(ok=False, error="internal error", is_transient=True)

    def _make_result(self, call: ToolCall, out: ToolOutput, num_attempts: int,
                     latency_ms: int) -> ToolResult:
        status = (ToolStatus.SUCCESS if out.ok
                  else ToolStatus.TIMEOUT if out.is_timeout else ToolStatus.FAILURE)
        text, is_truncated = _truncate(out.output, self._limits.max_output_chars)
        payload_tokens = self._count_tokens(text) + self._count_tokens(out.error)
        size_class = self._limits.size_thresholds.classify(payload_tokens)
        return ToolResult(
            call_id=call.call_id, tool=call.tool, status=status, output=text, error=out.error,
            payload_tokens=payload_tokens, latency_ms=latency_ms,
            state=ToolReturnState(call.tool, size_class, status), num_attempts=num_attempts,
            truncated=is_truncated,
        )

    def list_rewards(self) -> list[RewardInfo]:
        """All registered rewards, sorted by name."""
        return [RewardInfo(r.name, r.description)
                for r in sorted(self._rewards, key=lambda r: r.name)]

    async def score(self, request: ScoreRequest, deadline_ms: int | None = None
                    ) -> ScoreResult:
        """Score a finished trajectory with the named reward, within its timeout
        (``options["timeout_s"]``) and the caller's ``deadline_ms`` (None: none).

        Raises:
            UnknownReward: The reward (or a composite's component) is not registered.
            Internal: The reward raised, ran past its timeout, or returned a score that is
                not a finite number in [0, 1] (a composite: [0, sum of weights]); the
                message names the reward.
            Unavailable: A remote judge failed (raised by the reward).
            DeadlineExceeded: The caller's deadline passed before the reward could start.
        """
        reward = self._rewards.get(request.reward)
        timeout_s = float(request.options.get("timeout_s") or self._limits.reward_timeout_s)
        if deadline_ms is not None:
            if deadline_ms <= 0:
                raise DeadlineExceeded(f"reward {request.reward!r}: the caller's deadline "
                                       "passed before it could start")
            timeout_s = min(timeout_s, deadline_ms / 1000)
        try:
            async with asyncio.timeout(timeout_s):
                out = await reward.score(request)
            upper = (sum(w for _, w in composite_weights(request.options))
                     if request.options.get("components") else 1.0)
            out = check_output(request.reward, out, max_reward=upper)
        except LibraError:
            raise  # unknown component, judge unavailable: already an API error
        except TimeoutError:
            raise Internal(f"reward {request.reward!r} timed out after {timeout_s:g}s") from None
        except RewardContractError as exc:
            raise Internal(str(exc)) from exc
        except Exception as exc:  # noqa: BLE001 - a plugin fault fails this trajectory
            logger.warning("[reward] reward=%s trajectory_id=%s raised %s: %s", request.reward,
                           request.trajectory_id, type(exc).__name__, exc)
            raise Internal(f"reward {request.reward!r} raised {type(exc).__name__}: {exc}"
                           ) from exc
        return ScoreResult(request.trajectory_id, float(out.reward), dict(out.details),
                           {k: float(v) for k, v in out.components.items()})


def _truncate(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"\n...[truncated {len(text) - max_chars} chars]", True
