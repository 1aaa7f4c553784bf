"""Weight sync after a training step, and the partial-rollout version accounting.

Every ``sync_interval`` steps (``SystemConfig``) the rollout instances pause while
they receive the new weights (sized by the model over the inter-node link, per TP
shard). Turns in progress are
not aborted or drained: they go on under the new weights once the pause ends, as
AReaL's interruptible generation does (partial rollout). Every asynchronous system
runs this way in the simulator, except systems with ``drain_before_sync`` (the
reference's trainer): there dispatch stops, in-flight trajectories finish, the weights
transfer while the trainer waits, and only then do dispatch and training resume. The
version accounting below (``TrajState``'s ``last_version``) is what ``bounded``
consumption reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine import Simulator


def sync_weights(sim: Simulator, now: float) -> float:
    """Pause every live instance for the weight transfer; move in-flight turns on to
    the new version (a turn generating now counts as one partial rollout). The rollout
    side now serves the trainer's version. Returns the longest pause in seconds."""
    version = sim.weights_version = sim.version
    if sim.system.mode == "sync":
        return 0.0  # colocated: the engine reloads in place, folded into the step
    longest_s = 0.0
    for inst in sim.instances.values():
        if not inst.alive:
            continue
        pause_s = (
            sim.model.num_params * sim.model.dtype_bytes / inst.tp
            / sim.hw.inter_node_bw_bytes_per_s
        )
        if inst.seg_steps:
            sim.finish_steps(inst, inst.steps_done_by(now), now)
        for seq in inst.running.values():
            sim.partial_rollouts += seq.traj.last_version < version
            seq.traj.last_version = version
        for seq in inst.waiting:
            seq.traj.last_version = version  # its first token comes under the new weights
        inst.pause_until = max(now, inst.seg_start) + pause_s
        longest_s = max(longest_s, inst.pause_until - now)
        sim.sync_pause_s += pause_s
        sim.replan_segment(inst, now)
    return longest_s


def after_step(sim: Simulator, now: float) -> None:
    """A training step ended: sync if the interval is due (drained or not)."""
    if sim.version % sim.system.sync_interval:
        return
    if sim.system.drain_before_sync and sim.system.mode == "async":
        sim.draining, sim.drain_started_s = True, now
        maybe_drained(sim, now)
    else:
        sync_weights(sim, now)


def maybe_drained(sim: Simulator, now: float) -> None:
    """During a drain: once nothing is in flight, transfer, and resume at ``SYNC_DONE``."""
    if sim.in_flight_versions or sim.drain_started_s < 0:
        return
    sim.drain_s += now - sim.drain_started_s
    sim.drain_started_s = -1.0
    sim.sync_done_at(now + sync_weights(sim, now))
