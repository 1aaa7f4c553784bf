"""Field names of the Redis hashes several services share, and their codecs.

``libra.redis_keys`` says which keys exist; this module says what a hash under one of
them holds, so the writer and every reader spell a field the same way. Pure: values go
to and come from plain mappings (redis-py's replies, bytes or text).

A lease (``keys.lease(worker_id)``, written by the coordinator, read by the scheduler
to place and fence, and checked by the rollout's fenced scripts):

- ``worker_id``, ``role`` (a ``WorkerRole`` value), ``bucket``, ``address``,
  ``ttl_ms``: as granted;
- ``epoch``: the fencing epoch, set by the grant script from ``keys.FENCE`` (never by
  the codec: ``lease_to_hash`` leaves it out for that reason, see ``LEASE_GRANT_FIELDS``);
- ``change_token``: written by a role change, so a retried change recognises itself.

The key's TTL is the lease's lifetime: ``expires_at_ms`` is derived from PTTL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from libra import types as t

LEASE_WORKER_ID = "worker_id"
LEASE_ROLE = "role"
LEASE_BUCKET = "bucket"
LEASE_ADDRESS = "address"
LEASE_EPOCH = "epoch"
LEASE_TTL_MS = "ttl_ms"
LEASE_CHANGE_TOKEN = "change_token"

# Every field of ``t.Lease`` a lease hash holds.
LEASE_FIELDS = (LEASE_WORKER_ID, LEASE_ROLE, LEASE_BUCKET, LEASE_ADDRESS, LEASE_EPOCH,
                LEASE_TTL_MS)
# The fields a grant writes from the lease itself (the epoch comes from the fence).
LEASE_GRANT_FIELDS = tuple(f for f in LEASE_FIELDS if f != LEASE_EPOCH)
# What the scheduler reads per worker (HMGET, in this order): ``lease_summary``.
LEASE_SUMMARY_FIELDS = (LEASE_ROLE, LEASE_BUCKET, LEASE_EPOCH)

# Lua: return 0 unless the lease hash KEYS[1] is held at epoch ARGV[1] (a fenced write
# by the lease's holder). Scripts start with it.
LEASE_EPOCH_CHECK_LUA = (
    f"if redis.call('HGET', KEYS[1], '{LEASE_EPOCH}') ~= ARGV[1] then return 0 end\n")


def lease_to_hash(lease: t.Lease) -> dict[str, str]:
    """A lease as its hash holds it (every field of ``LEASE_FIELDS``)."""
    return {LEASE_WORKER_ID: lease.worker_id, LEASE_ROLE: lease.role.value,
            LEASE_BUCKET: lease.bucket, LEASE_ADDRESS: lease.address,
            LEASE_EPOCH: str(lease.epoch), LEASE_TTL_MS: str(lease.ttl_ms)}


def lease_from_hash(h: Mapping[str, str] | Mapping[bytes, bytes], pttl_ms: int,
                    now_ms: int) -> t.Lease:
    """Inverse of ``lease_to_hash``; ``pttl_ms``: the key's remaining TTL at ``now_ms``."""
    f = {_text(k): _text(v) for k, v in h.items()}
    return t.Lease(t.WorkerId(f[LEASE_WORKER_ID]), t.WorkerRole(f[LEASE_ROLE]),
                   f[LEASE_BUCKET], f[LEASE_ADDRESS], int(f[LEASE_EPOCH]),
                   now_ms + max(pttl_ms, 0), int(f[LEASE_TTL_MS]))


def lease_summary(worker_id: str,
                  values: Sequence[str | bytes | None]) -> t.LeaseSummary | None:
    """A summary from the ``LEASE_SUMMARY_FIELDS`` values of one lease hash; ``None``
    when it has no role (the key expired: the worker is gone)."""
    role, bucket, epoch = values
    if not role:
        return None
    return t.LeaseSummary(worker_id, _text(role), _text(bucket or b""),
                          int(epoch) if epoch else 0)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
