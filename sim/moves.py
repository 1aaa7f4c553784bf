"""How a planner move changes the simulated cluster: the reconfigure strategies.

A move (``sim.replan.apply_plan``) changes the pattern of some rollout nodes, turns
some into training nodes or some training nodes into rollout nodes. What a real system
pays for it depends on how it carries the change out, so each strategy below is what a
real counterpart does, and the simulator charges what that costs:

- **Releasing a node** (what happens to the turns it is generating):
  ``restart``: the engine is stopped; its turns restart elsewhere from their context
  (the tokens already generated are lost; today's behaviour, session 15).
  ``drain``: the node stops admitting and finishes the turns it is generating; each
  trajectory moves at its next turn boundary, re-prefilling its context on the new
  instance (the reference's ``runtime_drain_before_reconfigure``: dispatcher paused,
  ``wait_until_idle``; Libra moves trajectories only between turns, design 3.3).
  ``migrate``: the node's turns are aborted and resubmitted elsewhere with the tokens
  generated so far, which the new instance prefills with the context (verl's fully
  async partial rollout: abort, keep tokens, retry through the load balancer; slime's
  ``--partial-rollout``). The simulator already charges a C-MLFQ migration the same
  way: a full re-prefill of the context on the new instance.
- **Order** (how many nodes change at once):
  ``all``: every changed node at once (the reference's ``diff``: unchanged nodes keep
  serving). ``staged``: ``SystemConfig.reconfigure_stage_nodes`` nodes at a time, the
  next once the previous are serving again, so capacity never drops by more.
  ``prewarm``: nodes that come from training (their devices are free) load the weights
  first while the old rollout nodes keep serving; the changed rollout nodes are
  released once those are up (the reference's ``prewarm``, which starts the new
  instances before stopping the old ones when spare devices allow; with none spare it
  is ``all``, as the reference falls back to another strategy).

A released node loads its new pattern's weights before it serves (``bring_up``). A node
leaving rollout for training joins the training group once released: until then the
trainer keeps the old group (``sim.plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from libra.errors import InvalidArgument

if TYPE_CHECKING:
    from scheduling.planner import Plan
    from sim.engine import Simulator

NodePattern = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MoveStrategy:
    """How a move releases nodes (``inflight``) and in what order (``order``)."""

    name: str
    inflight: str
    """``restart``, ``drain`` or ``migrate`` (module docstring)."""
    order: str
    """``all``, ``staged`` or ``prewarm`` (module docstring)."""


RECONFIGURE_STRATEGIES: dict[str, MoveStrategy] = {
    s.name: s
    for s in (
        MoveStrategy("restart_all", "restart", "all"),
        MoveStrategy("drain", "drain", "all"),
        MoveStrategy("migrate", "migrate", "all"),
        MoveStrategy("staged", "drain", "staged"),
        MoveStrategy("staged_migrate", "migrate", "staged"),
        MoveStrategy("prewarm", "drain", "prewarm"),
        MoveStrategy("prewarm_migrate", "migrate", "prewarm"),
    )
}
"""Every reconfigure strategy by name (the registry is the list)."""


def strategy(name: object) -> MoveStrategy:
    """The strategy called ``name``; ``InvalidArgument`` naming the field otherwise."""
    if not isinstance(name, str) or name not in RECONFIGURE_STRATEGIES:
        raise InvalidArgument(
            "reconfigure_strategy",
            f"must be one of {', '.join(RECONFIGURE_STRATEGIES)}, got {name!r}",
        )
    return RECONFIGURE_STRATEGIES[name]


def _up_to_date(sim: Simulator, node: int, now: float) -> list[Any]:
    """``node``'s instances with their segments applied up to ``now`` (the step in
    progress included, as an arrival does: ``Simulator._kick``)."""
    insts = [inst for inst in sim.instances.values() if inst.node == node]
    for inst in insts:
        if inst.seg_steps:
            sim.finish_steps(inst, inst.steps_done_by(now), now)
    return insts


def keep_partial_turns(sim: Simulator, node: int, now: float) -> int:
    """Before ``node`` is torn down, let every turn it decodes keep its generated tokens
    (``TrajState.partial_tokens``); return how many tokens were kept."""
    kept = 0
    for inst in _up_to_date(sim, node, now):
        for seq in inst.running.values():
            if seq.prefill_left > 0:
                continue  # still prefilling: nothing new generated
            turn = seq.traj.rec.turns[seq.traj.turn]
            done = turn.output_tokens - inst.decode_left(seq)
            # At least one token is left to decode, so the resumed turn is a turn.
            new = min(done, turn.output_tokens - 1)
            kept += max(0, new - seq.traj.partial_tokens)
            seq.traj.partial_tokens = max(seq.traj.partial_tokens, new)
    return kept


def generated_tokens(sim: Simulator, node: int, now: float) -> int:
    """Tokens ``node``'s turns have generated in this attempt (lost on a restart)."""
    lost = 0
    for inst in _up_to_date(sim, node, now):
        for seq in inst.running.values():
            if seq.prefill_left <= 0:
                lost += seq.decode_left - inst.decode_left(seq)
    return lost


def lend_node(sim: Simulator, node: int, now: float) -> list[Any]:
    """The elastic pool takes ``node`` for training: torn down at once (the pool's
    join waits for nobody), its turns keeping their tokens under the ``migrate``
    strategies (``SystemConfig.pool_keeps_partial``), else restarting."""
    how = strategy(sim.system.reconfigure_strategy)
    if sim.system.pool_keeps_partial and how.inflight == "migrate":
        keep_partial_turns(sim, node, now)
    return sim.teardown_node(node, now)


@dataclass(slots=True)
class NodeOp:
    """One node's change: ``old`` pattern (``None``: it was a training node) to ``new``
    (``None``: it becomes a training node)."""

    node: int
    old: NodePattern | None
    new: NodePattern | None
    state: str = "queued"
    """``queued``, ``draining``, ``loading`` or ``done``."""
    begin_s: float | None = None
    """When it stopped serving (or, from training, began loading)."""
    released_s: float | None = None
    """When it held no work any more."""
    up_s: float | None = None
    """When its new instances served (or it joined training)."""


class Transition:
    """A move under way: which nodes change, which are released, loading or done.

    Args:
        sim: The simulator (its nodes, policy and trainer).
        plan: The plan being moved to.
        ops: The nodes that change.
        how: The strategy.
        stage_nodes: Nodes changed at once under ``staged``.
        now: When the move starts.
    """

    def __init__(
        self, sim: Simulator, plan: Plan, ops: list[NodeOp], how: MoveStrategy,
        stage_nodes: int, now: float,
    ) -> None:
        self._sim, self.plan, self.ops, self.how = sim, plan, ops, how
        self._stage = stage_nodes
        self._by_node = {op.node: op for op in ops}
        self._check: set[int] = set()
        """Draining nodes a turn ended on since the last ``settle``."""
        self.queued_plan: Plan | None = None
        """A plan the planner applied while this move was under way (started after it)."""
        self.record: dict[str, Any] = {
            "start_s": now, "end_s": None, "strategy": how.name, "nodes": len(ops),
            "handed_back": 0, "kept_tokens": 0, "lost_tokens": 0,
            "max_nodes_out": 0, "train_switch_s": None,
        }

    # Queries.

    def is_draining(self, iid: str) -> bool:
        """Whether instance ``iid`` is on a node that drains (serves, admits nothing)."""
        inst = self._sim.instances.get(iid)
        op = self._by_node.get(inst.node) if inst is not None else None
        return op is not None and op.state == "draining"

    @property
    def busy_nodes(self) -> set[int]:
        """Nodes still changing (not to be lent to training by the elastic pool)."""
        return {op.node for op in self.ops if op.state != "done"}

    @property
    def done(self) -> bool:
        """Every node of the move serves its new pattern (or trains)."""
        return all(op.state == "done" for op in self.ops)

    # Progress.

    def start(self, now: float) -> None:
        """Begin the ops the order allows now."""
        first = [op for op in self.ops if op.old is None] if self.how.order == "prewarm" else []
        if self.how.order == "staged":
            first = self.ops[: self._stage]
        elif not first:
            first = list(self.ops)  # ``all``, or ``prewarm`` with no spare devices
        for op in first:
            self._begin(op, now)
        self._maybe_switch_train(now)
        self.settle(now)

    def note(self, iid: str) -> None:
        """A turn ended on ``iid``: check its node at the next ``settle``."""
        if self.is_draining(iid):
            self._check.add(self._sim.instances[iid].node)

    def settle(self, now: float) -> None:
        """Replace every draining node that holds no turn any more."""
        check, self._check = self._check, set()
        for node in sorted(check):
            op = self._by_node[node]
            if op.state == "draining" and self._empty(node):
                self._sim.nodes.teardown(node, now)
                self._released(op, now)

    def on_node_up(self, node: int, now: float) -> None:
        """A node of this move finished loading its weights."""
        op = self._by_node.get(node)
        if op is None or op.state != "loading":
            return
        op.state, op.up_s = "done", now
        self._advance(now)

    # Steps of one node.

    def _begin(self, op: NodeOp, now: float) -> None:
        sim = self._sim
        op.begin_s = now
        if op.old is None:
            self._released(op, now)  # a training node: its devices are free
            return
        handed: list[Any] = []
        if self.how.inflight == "restart":
            self.record["lost_tokens"] += generated_tokens(sim, op.node, now)
            handed = sim.teardown_node(op.node, now)
        elif self.how.inflight == "migrate":
            self.record["kept_tokens"] += keep_partial_turns(sim, op.node, now)
            handed = sim.teardown_node(op.node, now)
        else:
            op.state = "draining"
            self._start_drain(op.node)
            self._check.add(op.node)
            self._count_out()
            return
        self.record["handed_back"] += len(handed)
        self._released(op, now)

    def _start_drain(self, node: int) -> None:
        """Stop admitting; hand back what has not begun (queued turns, trajectories in
        their tool); turns being generated finish here."""
        sim = self._sim
        sim.nodes.stop_admitting(node)
        iids = {i for i, inst in sim.instances.items() if inst.node == node}
        for iid in iids:
            inst = sim.instances[iid]
            while inst.waiting:
                t = inst.waiting.popleft().traj
                sim.unpin(t)
                sim.enqueue(t)
                self.record["handed_back"] += 1
        for t in sim.trajs:
            if t.placed and t.instance in iids and t.in_tool:
                sim.unpin(t)
                self.record["handed_back"] += 1

    def _empty(self, node: int) -> bool:
        return not any(
            inst.running or inst.waiting
            for inst in self._sim.instances.values() if inst.node == node
        )

    def _released(self, op: NodeOp, now: float) -> None:
        """The node holds no work: load its new pattern, or hand it to training."""
        from sim.replan import bring_up  # replan imports this module

        op.released_s = now
        if op.new is None:
            op.state, op.up_s = "done", now
            self._maybe_switch_train(now)
            self._advance(now)
            return
        op.state = "loading"
        bring_up(self._sim, op.node, op.new, now)
        self._count_out()

    def _count_out(self) -> None:
        out = sum(1 for op in self.ops if op.state in ("draining", "loading") and op.old)
        self.record["max_nodes_out"] = max(self.record["max_nodes_out"], out)

    def _maybe_switch_train(self, now: float) -> None:
        """The trainer takes the new group once every node joining it is released."""
        if self.record["train_switch_s"] is not None:
            return
        if all(op.state == "done" for op in self.ops if op.new is None):
            self._sim.plan = self.plan
            self.record["train_switch_s"] = now

    def _advance(self, now: float) -> None:
        """Begin what the order allows next; end the move when every node is done."""
        queued = [op for op in self.ops if op.state == "queued"]
        active = [op for op in self.ops if op.state in ("draining", "loading")]
        if queued and self.how.order == "staged":
            for op in queued[: max(0, self._stage - len(active))]:
                self._begin(op, now)
        elif queued and self.how.order == "prewarm" and not active:
            for op in queued:
                self._begin(op, now)
        if self.done and self.record["end_s"] is None:
            self._finish(now)

    def _finish(self, now: float) -> None:
        sim = self._sim
        self.record["end_s"] = now
        self.record["ops"] = [
            {"node": op.node, "old": op.old, "new": op.new, "begin_s": op.begin_s,
             "released_s": op.released_s, "up_s": op.up_s}
            for op in self.ops
        ]
        sim.move_log.append(self.record)
        sim.transition = None
        sim.admit_pending(now)
        if self.queued_plan is not None:
            from sim.replan import apply_plan

            apply_plan(sim, self.queued_plan, now, counted=False)
