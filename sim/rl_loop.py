"""The RL step loop of a simulated run: which steps' trajectories are released, when a
batch trains, and what follows a trained step.

A step's trajectories are released while the trainer is within the system's staleness
bound of them (none for sync systems); a batch trains once the consumption rule
(``sim.trainer.BatchSource``) hands one over and the trainer is free; after a step the
weights sync (``sim.weight_sync``) and the planner runs (``sim.replan``). These
functions act on a ``sim.engine.Simulator``; they are kept apart from the event loop
because they pace the run by training steps, not by trajectory events.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from sim import replan, weight_sync

if TYPE_CHECKING:
    from sim.engine import Simulator


def maybe_train(sim: Simulator, now: float) -> None:
    """Start the next training step if the trainer is free and its batch is ready."""
    trained = sim.trainer.version
    if sim.trainer.busy or sim.draining or trained >= len(sim.steps):
        return
    step = sim.steps[trained]
    batch = sim.batches.take(
        step, step in sim.step_complete_s, trained,
        in_flight=sim.in_flight_versions, max_staleness=sim.system.staleness,
        last=sim.finished == len(sim.trajs),
    )
    if batch is None:
        return
    sim.consumed[step] = batch
    sim.batch_span_s[step] = replan.span_s(sim, step, batch, now)
    tokens = [t.rec.total_tokens for t in batch]
    train_s = sim.trainer.start(step, tokens, sim.plan.train, len(sim.pool.active), now)
    sim.train_done_at(now + train_s, step)


def on_train_done(sim: Simulator, step: int, now: float) -> None:
    """``TRAIN_DONE``: sync weights, run the planner, release and train what is due."""
    sim.trainer.done()
    weight_sync.after_step(sim, now)
    if sim.planner is not None:
        replan.run_planner(sim, step, now)
    release_allowed(sim, now)
    maybe_train(sim, now)


def release_allowed(sim: Simulator, now: float) -> None:
    """Release every step the staleness bound allows, then admit what is queued."""
    bound = 0 if sim.system.mode == "sync" else sim.system.staleness
    progress = sim.version
    if sim.system.consumption == "bounded":
        # Whole steps' worth consumed, as the live scheduler's admission budget counts
        # (a batch may take more than a step's share when due trajectories demand it).
        progress = bisect.bisect_right(sim.cum_sizes, sim.batches.consumed)
    while sim.released_steps < len(sim.steps) and sim.released_steps <= progress + bound:
        release_step(sim, sim.released_steps, now)
    sim.admit_pending(now)


def release_step(sim: Simulator, step_index: int, now: float) -> None:
    """Queue every trajectory of ``steps[step_index]``."""
    step = sim.steps[step_index]
    sim.batches.on_release(step, sim.weights_version)
    sim.release_s[step] = now
    for t in sim.by_step[step]:
        t.released_s = now
        sim.enqueue(t)
    sim.released_steps = step_index + 1


def on_sync_done(sim: Simulator, now: float) -> None:
    """``SYNC_DONE``: a drained sync ended; dispatch and training resume."""
    sim.draining = False
    release_allowed(sim, now)
    maybe_train(sim, now)
