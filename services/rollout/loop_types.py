"""The rollout loop's types: the collaborators it is given, its settings, its state.

The engine, the engine loader and the scheduler come in as Protocols (the torch and vLLM
engines, the gRPC scheduler client and the test fakes implement them). The per-job and
per-trajectory state, and the lease, are shared by the core and its two collaborators
(:class:`services.rollout.mover.Mover`, :class:`services.rollout.lender.Lender`), so
they live here rather than in any one of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from libra import types as t
from libra.jobspec import JobSpec, ModelSpec
from services.rollout import agent
from services.rollout.engine_types import GenerationRequest, GenerationResult

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.rollout.store_protocol import InboxEntry


class Engine(Protocol):
    policy_version: int

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]: ...

    def load_weights(self, path: str, version: int) -> None: ...

    def abort(self) -> None: ...

    def abort_rows(self, rows: Iterable[int]) -> None: ...

    def load_weights_bytes(self, data: bytes, version: int) -> None: ...


class EngineLoader(Protocol):
    def load(self, model_dir: str, policy: t.PolicyInfo, tp_degree: int,
             model: ModelSpec) -> tuple[Engine, agent.Tokenizer]: ...


class SchedulerApi(Protocol):
    """Decisions at tool returns (the client batches concurrent reports on one stream).
    Finishes need no call: the scheduler reads them from the trajectory stream. Without
    ``needs_answer`` a stay may be settled late (with a later batch's answer)."""

    async def report_tool_return(self, job_id: str, trajectory_id: str,
                                 state: t.ToolReturnState, tokens_so_far: int,
                                 instance_id: str, lease_epoch: int,
                                 needs_answer: bool = True) -> t.PlacementDecision: ...


@dataclass(frozen=True)
class RolloutSettings:
    instance_id: str
    bucket: str
    address: str = ""
    max_batch_size: int = 8
    max_trajectories: int = 16
    lease_ttl_ms: int = 3000
    tool_deadline_s: float = 5.0
    idle_block_ms: int = 200
    policy_poll_s: float = 0.05
    weight_load_deadline_s: float = 30.0
    role: t.WorkerRole = t.WorkerRole.CORE_ROLLOUT
    """``HYBRID_ROLLOUT`` lets the elastic pool lend this instance to training."""


@dataclass
class LeaseHolder:
    """This instance's lease, shared by the core, the mover and the lender: renewals
    and role changes replace it, under ``lock`` (both move the epoch, so they never
    interleave)."""

    lease: t.Lease | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def epoch(self) -> int:
        """The epoch fenced writes carry (0 without a lease: every fence refuses it)."""
        return self.lease.epoch if self.lease else 0


@dataclass
class ActiveTrajectory:
    entry: InboxEntry
    traj: t.Trajectory
    # Waiting for its next turn (not in an engine call, a tool call or its finish).
    ready: bool = True
    # Tokens of the current turn sampled before an interruption (a weight update; or
    # where it was handed over from, when a move or a hand-back interrupted it).
    turn_prefix: list[int] = field(default_factory=list)
    # A MOVE decided for it and not yet handed off.
    move: t.PlacementDecision | None = None
    # Its index in the engine call in flight (None outside one): a late MOVE stops it.
    row: int | None = None

    def state_to_hand_over(self) -> t.Trajectory:
        """The trajectory as another instance continues it (with its partial turn)."""
        self.traj.partial_turn_tokens = len(self.turn_prefix)
        return self.traj


@dataclass
class JobContext:
    spec: JobSpec
    engine: Engine
    agent: agent.Agent
    max_batch_size: int
    """The job's bucket's ``max_batch_size``, capped by this instance's."""
    active: dict[str, ActiveTrajectory] = field(default_factory=dict)

    def holds(self, act: ActiveTrajectory) -> bool:
        """True while ``act`` is this instance's copy of its trajectory (not dropped; a
        copy of the same id placed here again is another object)."""
        return self.active.get(act.traj.trajectory_id) is act

    def forget_active(self) -> None:
        """Drop every trajectory held here (the lease was lost, or the job ended). An
        external agent also stops waiting for their programs' calls: each
        trajectory's new holder takes them."""
        drop = getattr(self.agent, "drop", None)
        if drop is not None:
            drop(list(self.active))
        self.active.clear()
