"""Weight sync after a training step, and the partial-rollout version accounting.

After each step the rollout instances pause while they receive the new weights
(sized by the model over the inter-node link, per TP shard). Turns in progress are
not aborted or drained: they go on under the new weights once the pause ends, as
AReaL's interruptible generation does (partial rollout). Every asynchronous system
runs this way in the simulator; the version accounting below (``TrajState``'s
``last_version``) is what ``bounded`` consumption reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.engine import Simulator


def sync_weights(sim: Simulator, now: float) -> None:
    """Pause every live instance for the weight transfer; move in-flight turns on to
    the new version (a turn generating now counts as one partial rollout)."""
    if sim.system.mode == "sync":
        return  # colocated: the engine reloads in place, folded into the step
    version = sim.version
    for inst in sim.instances.values():
        if not inst.alive:
            continue
        pause_s = (
            sim.model.num_params * sim.model.dtype_bytes / inst.tp
            / sim.hw.inter_node_bw_bytes_per_s
        )
        if inst.seg_steps:
            sim.finish_steps(inst, inst.steps_done_by(now), now)
        for seq in inst.running:
            sim.partial_rollouts += seq.traj.last_version < version
            seq.traj.last_version = version
        for seq in inst.waiting:
            seq.traj.last_version = version  # its first token comes under the new weights
        inst.pause_until = max(now, inst.seg_start) + pause_s
        sim.sync_pause_s += pause_s
        sim.replan_segment(inst, now)
