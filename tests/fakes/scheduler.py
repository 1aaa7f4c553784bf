"""Fake scheduler client for the rollout core (``services.rollout.core.SchedulerApi``).

Replaces: the scheduler service (placement policy) behind gRPC. Everything else is
real. Decisions are scripted (default STAY); every call is recorded, with the lease
epoch it carried. Given a ``gate``, answers wait for it (a slow scheduler: the rollout
must not wait with them); ``num_answered`` counts answers given. (Finishes are not
reported by call: the scheduler reads the stream.)
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from libra import types as t


@dataclass
class FakeScheduler:
    decisions: deque = field(default_factory=deque)
    tool_returns: list[dict[str, Any]] = field(default_factory=list)
    gate: asyncio.Event | None = None
    num_answered: int = 0

    def move_to(self, instance_id: str, bucket: str = "long") -> None:
        self.decisions.append(t.PlacementDecision(t.DecisionAction.MOVE, bucket, instance_id,
                                                  "test"))

    def stay_at(self, instance_id: str, bucket: str = "long") -> None:
        """A STAY naming where the scheduler has the trajectory pinned."""
        self.decisions.append(t.PlacementDecision(t.DecisionAction.STAY, bucket, instance_id,
                                                  "already_in_target"))

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision:
        self.tool_returns.append({"job_id": job_id, "trajectory_id": trajectory_id,
                                  "state": state, "tokens_so_far": tokens_so_far,
                                  "instance_id": instance_id, "lease_epoch": lease_epoch,
                                  "needs_answer": needs_answer})
        if self.gate is not None:
            await self.gate.wait()
        self.num_answered += 1
        if self.decisions:
            return self.decisions.popleft()
        return t.PlacementDecision(t.DecisionAction.STAY)
