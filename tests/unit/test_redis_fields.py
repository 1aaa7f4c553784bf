"""The lease hash codec (libra/redis_fields.py): one spelling of every lease field."""

from __future__ import annotations

from libra import redis_fields as f
from libra import types as t

LEASE = t.Lease(t.WorkerId("ro-1"), t.WorkerRole.HYBRID_ROLLOUT, "long", "10.0.0.7:50051",
                epoch=42, expires_at_ms=0, ttl_ms=3_000)


def test_a_lease_round_trips_through_its_hash() -> None:
    h = f.lease_to_hash(LEASE)
    assert set(h) == set(f.LEASE_FIELDS)
    back = f.lease_from_hash(h, pttl_ms=2_500, now_ms=1_000)
    assert back == t.Lease(LEASE.worker_id, LEASE.role, LEASE.bucket, LEASE.address,
                           LEASE.epoch, 3_500, LEASE.ttl_ms)


def test_a_bytes_reply_decodes_the_same_and_an_expired_ttl_clamps_to_now() -> None:
    raw = {k.encode(): v.encode() for k, v in f.lease_to_hash(LEASE).items()}
    raw[f.LEASE_CHANGE_TOKEN.encode()] = b"abc"  # written by a role change: ignored
    back = f.lease_from_hash(raw, pttl_ms=-2, now_ms=1_000)
    assert (back.epoch, back.role, back.expires_at_ms) == (42, LEASE.role, 1_000)


def test_a_grant_writes_every_field_but_the_epoch() -> None:
    assert f.LEASE_EPOCH not in f.LEASE_GRANT_FIELDS
    assert set(f.LEASE_GRANT_FIELDS) | {f.LEASE_EPOCH} == set(f.LEASE_FIELDS)


def test_summary_reads_role_bucket_and_epoch_in_order() -> None:
    h = f.lease_to_hash(LEASE)
    values = [h[name].encode() for name in f.LEASE_SUMMARY_FIELDS]
    assert f.lease_summary("ro-1", values) == t.LeaseSummary("ro-1", "hybrid-rollout",
                                                             "long", 42)


def test_summary_of_an_expired_lease_is_none() -> None:
    assert f.lease_summary("ro-1", [None, None, None]) is None


def test_the_fenced_script_prefix_checks_the_epoch_field() -> None:
    assert f"'{f.LEASE_EPOCH}') ~= ARGV[1]" in f.LEASE_EPOCH_CHECK_LUA
