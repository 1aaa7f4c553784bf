"""Every Redis key the project uses, with its TTL and the reason it exists.

Keys are built only here. All start with ``libra:``. TTLs are in milliseconds; ``None``
means the key lives as long as its job and is removed by ``job_keys`` clean-up.
"""

from __future__ import annotations

PREFIX = "libra"

# Job index (sorted set: job_id scored by creation time). Lists jobs; never expires.
JOBS_INDEX = f"{PREFIX}:jobs"

# The job queue (sorted set: job_id of each queued PENDING job, scored so that a higher
# priority comes first and equal priorities keep submit order; see the coordinator's
# store). Never expires: a queued job waits for its turn, across coordinator restarts.
JOB_QUEUE = f"{PREFIX}:queue"

# Submit order of queued jobs (INCR per enqueue: the FIFO tie-break). Never expires.
JOB_QUEUE_SEQ = f"{PREFIX}:queue:seq"

# Registry of workers that ever held a lease (set). The lease key itself expires.
WORKERS = f"{PREFIX}:workers"

# Global fencing counter: INCR on every membership change (lease grant); never expires.
FENCE = f"{PREFIX}:fence"

# A worker's lease (hash: fields and codec in libra/redis_fields.py). Expires when the worker
# stops renewing, which is how the system learns it died.
LEASE_TTL_MS_DEFAULT = 3_000

# Trajectory stream consumer group names.
TRAINER_GROUP = "trainer"
ROLLOUT_GROUP = "rollout"
# The scheduler reads finished trajectories from the same stream to give slots back.
SCHEDULER_GROUP = "scheduler"

# Terminal jobs keep their keys this long so `libra jobs` and reports still work.
FINISHED_JOB_TTL_MS = 7 * 24 * 3600 * 1000

# Step history and event streams are capped (XADD MAXLEN ~) to bound memory.
HISTORY_MAXLEN = 100_000
EVENTS_MAXLEN = 10_000


def lease(worker_id: str) -> str:
    """Hash with the worker's lease; PX = lease TTL."""
    return f"{PREFIX}:lease:{worker_id}"


def inbox(instance_id: str) -> str:
    """Stream of trajectory tasks placed on one rollout instance (group ``rollout``).

    Pending entries are what the instance holds; if its lease expires the scheduler
    re-places them and deletes the stream.
    """
    return f"{PREFIX}:inbox:{instance_id}"


def job(job_id: str) -> str:
    """Hash: spec_json, state, name, created/updated ms, message, run_dir."""
    return f"{PREFIX}:job:{job_id}"


def trajectories(job_id: str) -> str:
    """Stream of finished trajectories (serialised common.v1.Trajectory), group ``trainer``."""
    return f"{PREFIX}:job:{job_id}:traj"


def policy(job_id: str) -> str:
    """Hash: current policy version, weights path, sha256, model dir, published ms."""
    return f"{PREFIX}:job:{job_id}:policy"


def weights_in_use(job_id: str) -> str:
    """Hash instance_id -> "<loaded version> <loading version>" (-1: none): the weight
    versions each rollout instance holds or is fetching. The trainer keeps those files
    when it prunes, counting only instances whose lease is live; a field is deleted
    when the instance leaves the job. Lives as long as the job."""
    return f"{PREFIX}:job:{job_id}:weights_in_use"


def counters(job_id: str) -> str:
    """Hash of cumulative trajectory/group counters (admitted, produced, trained, dropped,
    ``migrations``, and ``placed:<bucket>``: placements into a bucket, moves included)."""
    return f"{PREFIX}:job:{job_id}:counters"


def placed_counter(bucket: str) -> str:
    """Field of ``counters``: placements into ``bucket`` (by the scheduler, and moves in
    by the instance that hands a trajectory off)."""
    return f"placed:{bucket}"


def load(job_id: str) -> str:
    """Hash instance_id -> live trajectories pinned there (HINCRBY; shared by replicas)."""
    return f"{PREFIX}:job:{job_id}:load"


def assignments(job_id: str) -> str:
    """Hash trajectory_id -> instance_id for every trajectory not yet finished."""
    return f"{PREFIX}:job:{job_id}:assign"


def tasks(job_id: str) -> str:
    """Hash trajectory_id -> serialised task, kept until finish so it can be re-placed."""
    return f"{PREFIX}:job:{job_id}:tasks"


def pending(job_id: str) -> str:
    """Hash trajectory_id -> serialised task admitted (or re-queued) but not yet placed.

    Admission writes it in the same transaction that counts the group, so a scheduler
    restart loses nothing it admitted.
    """
    return f"{PREFIX}:job:{job_id}:pending"


def trained_ids(job_id: str) -> str:
    """Set of trajectory ids already trained on or dropped: makes the trainer idempotent."""
    return f"{PREFIX}:job:{job_id}:trained"


def published_ids(job_id: str) -> str:
    """Set of trajectory ids published to the job's stream: a repeat publish (a retry
    whose first try was applied before its reply was lost, e.g. across a Redis restart)
    is recognised and counted as ``duplicate_publishes`` instead of appended twice."""
    return f"{PREFIX}:job:{job_id}:published"


def history(job_id: str) -> str:
    """Stream of per-step records (JSON), capped at HISTORY_MAXLEN."""
    return f"{PREFIX}:job:{job_id}:history"


def step_index(job_id: str) -> str:
    """Hash step number -> "<history entry id> <idempotency key>" of the record stored
    for that step: makes step reports idempotent (a retried report is recognised, a
    redone step replaces its record). Lives as long as the job."""
    return f"{PREFIX}:job:{job_id}:steps"


def events(job_id: str) -> str:
    """Stream of events (failures, re-queues, plans), capped at EVENTS_MAXLEN."""
    return f"{PREFIX}:job:{job_id}:events"


def sched_trajectories(job_id: str) -> str:
    """Hash trajectory_id -> JSON policy record of a placed trajectory (pinned instance,
    tool-return path so far). Written behind by the scheduler after every call so a
    restarted scheduler still knows where each trajectory is pinned; a field is deleted
    when its trajectory finishes or is aborted. No TTL: lives as long as the job."""
    return f"{PREFIX}:job:{job_id}:sched:traj"


def sched_records(job_id: str) -> str:
    """Hash JSON [namespace, key] -> JSON policy record (e.g. LA-MLFQ history and scouts).
    One hash for every namespace so job clean-up knows the key. No TTL: the policy prunes
    its own records at step ends."""
    return f"{PREFIX}:job:{job_id}:sched:records"


def sched_recent(job_id: str) -> str:
    """List of recently finished trajectories (JSON), the prefix tree's rebuild source.
    Capped by RPUSH + LTRIM at the policy's recent window, so no TTL is needed."""
    return f"{PREFIX}:job:{job_id}:sched:recent"


def sched_tree(job_id: str) -> str:
    """String: JSON snapshot of the C-MLFQ prefix tree, replaced at every step end (and
    every ``tree_persist_interval_finishes``). A restarted scheduler restores from it plus
    the ring entries appended after it. No TTL: lives as long as the job."""
    return f"{PREFIX}:job:{job_id}:sched:tree"


def placement_epochs(job_id: str) -> str:
    """Hash instance_id -> the lease epoch the scheduler places the job's work on it
    under; a departed instance keeps its old epoch until the sweep that re-queued its
    work ended. A restarted scheduler compares its first lease snapshot with it: an
    instance that restarted (new epoch) or left while no scheduler ran still has its
    old work re-queued. No TTL: lives as long as the job."""
    return f"{PREFIX}:job:{job_id}:sched:epochs"


# Agent episodes (libra/episodes.py). An episode lives while its agent program calls:
# every key below lives EPISODE_TTL_MARGIN_MS past the episode's idle timeout at each call and
# is deleted when the episode closes, so a program that vanishes leaves nothing behind.
EPISODE_TTL_MARGIN_MS = 60_000


def episode_offers(job_id: str) -> str:
    """List of EpisodeOffer JSON: admitted external-agent trajectories waiting for an
    agent program (RPUSH by the rollout, BLPOP by ``POST /v1/episodes``). An offer
    nobody takes times out on the rollout (its trajectory fails, counted); the list
    lives as long as the job."""
    return f"{PREFIX}:job:{job_id}:episode_offers"


def episode(episode_id: str) -> str:
    """String: the endpoint's EpisodeState JSON (PX: idle timeout + margin)."""
    return f"{PREFIX}:episode:{episode_id}"


def episode_offered(episode_id: str) -> str:
    """String: set (NX) when the rollout first offers the episode; while it lives the
    episode is never offered again, so a trajectory re-placed before or during its
    program's calls (lease lapse, restart, resumed job) waits for that program's calls
    instead of getting a second program. TTL: the episode's, renewed by the endpoint
    at every call; not deleted at close (a re-placed trajectory then reads the close)."""
    return f"{PREFIX}:episode:{episode_id}:offered"


def episode_key(key_sha256: str) -> str:
    """String: episode id of an API key, by the key's sha256 (the key itself is never
    stored). Same TTL as the episode: the key expires with it."""
    return f"{PREFIX}:episode_key:{key_sha256}"


def episode_calls(episode_id: str) -> str:
    """List of EpisodeCall JSON (endpoint -> rollout; BLPOP by the rollout holding the
    episode's trajectory, whichever instance that is after a move)."""
    return f"{PREFIX}:episode:{episode_id}:calls"


def episode_replies(episode_id: str) -> str:
    """List of EpisodeReply JSON (rollout -> endpoint; BLPOP by the waiting call)."""
    return f"{PREFIX}:episode:{episode_id}:replies"


def episode_keys(episode_id: str) -> list[str]:
    """The keys of one episode (its API key's entry is deleted by hash separately)."""
    return [episode(episode_id), episode_calls(episode_id), episode_replies(episode_id),
            episode_offered(episode_id)]


def job_keys(job_id: str) -> list[str]:
    """Keys that belong to one job (expired together when the job ends)."""
    return [job(job_id), trajectories(job_id), policy(job_id), counters(job_id),
            load(job_id), assignments(job_id), tasks(job_id), pending(job_id),
            trained_ids(job_id), published_ids(job_id), weights_in_use(job_id),
            history(job_id), step_index(job_id), events(job_id), sched_trajectories(job_id),
            sched_records(job_id), sched_recent(job_id), sched_tree(job_id),
            placement_epochs(job_id), episode_offers(job_id)]
