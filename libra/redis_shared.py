"""Redis reads and set-up shared by the services' store adapters.

The coordinator owns the job hash; the scheduler, rollout and trainer stores read it
through ``JobRecordReader`` (bytes-mode client). Consumer groups are created once,
idempotently, by ``ensure_consumer_group``.
"""

from __future__ import annotations

from typing import Any

from libra import redis_keys as keys


class JobRecordReader:
    """Mixin for store adapters holding a bytes-mode ``redis.asyncio`` client in ``_r``."""

    _r: Any

    async def job_field(self, job_id: str, name: str) -> str | None:
        raw = await self._r.hget(keys.job(job_id), name)
        return raw.decode() if raw else None

    async def job_spec_json(self, job_id: str) -> str | None:
        return await self.job_field(job_id, "spec_json")

    async def job_state(self, job_id: str) -> str | None:
        return await self.job_field(job_id, "state")


async def ensure_consumer_group(redis: Any, stream: str, group: str) -> None:
    """Create ``group`` on ``stream`` (and the stream) unless it exists already."""
    try:
        await redis.xgroup_create(stream, group, id="0", mkstream=True)
    except Exception as exc:  # redis answers BUSYGROUP when the group exists
        if "BUSYGROUP" not in str(exc):
            raise
