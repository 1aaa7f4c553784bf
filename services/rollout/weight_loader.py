"""Loading a published policy version into the engine, verified (the rollout core's).

A version is loaded only when its checksum matches: a single safetensors file is hashed
on the host; a chunked version (a manifest) is fetched and verified chunk by chunk within
the weight-load deadline, then swapped in whole (a copy fetched over gRPC was hashed as it
arrived: the engine maps its file, not read or hashed again; a shared path is verified
here and its verified bytes are handed over). Where a manifest is
read from - the shared path or a copy fetched from the trainer over gRPC - is the
WeightSource's choice (services/rollout/weight_fetcher.py); without one, the shared
path. A refused version is remembered and reported once (an error event), and the old
weights keep serving until a newer version is published. The versions held and fetched
are announced around the load, so the trainer never prunes a file this instance is still
reading.

Pure, like the core: the store comes in as a collaborator.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from libra import types as t
from libra.errors import LibraError
from libra.weight_sync import MANIFEST_SUFFIX, WeightSyncError, read_verified, sha256_file
from services.rollout.loop_types import Engine
from services.rollout.weight_fetcher import verified_weights

if TYPE_CHECKING:  # collaborators' types only: cores import no grpc/redis at run time
    from services.rollout.store_protocol import RolloutStore
    from services.rollout.weight_fetcher import WeightSource

logger = logging.getLogger(__name__)


class WeightLoader:
    """Verified weight loads of one instance; remembers the versions it refused."""

    def __init__(self, instance_id: str, store: RolloutStore,
                 load_deadline_s: float, source: WeightSource | None = None) -> None:
        self._instance_id = instance_id
        self._store = store
        self.load_deadline_s = load_deadline_s
        self._source = source
        # (job, version, sha256) whose weights failed verification: checked and reported
        # once, not on every pass of the loop.
        self._rejected: set[tuple[str, int, str]] = set()
        self.on_reload: Callable[[float], None] | None = None
        """Told each completed load's seconds (verify + swap): set by the metrics view
        (services/rollout/metrics.py), so this module stays free of metrics code."""

    async def model_dir(self, job_id: str, policy: t.PolicyInfo) -> str:
        """The job's model directory an engine is built from: the shared path, or a copy
        fetched from the trainer (the WeightSource decides)."""
        if self._source is None:
            return policy.model_dir
        return await self._source.model_dir(job_id, policy)

    def is_rejected(self, job_id: str, policy: t.PolicyInfo) -> bool:
        return (job_id, policy.version, policy.sha256) in self._rejected

    async def load_newer(self, job_id: str, engine: Engine) -> None:
        """Load the published version if it is newer than the engine's (between calls)."""
        policy = await self._store.policy(job_id)
        if policy is not None and policy.version > engine.policy_version:
            await self.load_verified(job_id, engine, policy)

    async def abort_on_newer(self, job_id: str, engine: Engine, poll_s: float) -> None:
        """Abort the engine call in flight (at a token boundary) once a newer version
        that was not refused is published; runs until cancelled or that abort."""
        while True:
            await asyncio.sleep(poll_s)
            policy = await self._store.policy(job_id)
            if (policy is not None and policy.version > engine.policy_version
                    and not self.is_rejected(job_id, policy)):
                logger.debug("[weights] aborting engine call for version=%d", policy.version)
                engine.abort()
                return

    async def load_verified(self, job_id: str, engine: Engine, policy: t.PolicyInfo) -> None:
        """Load weights only when their checksum matches; otherwise keep serving the old.

        The versions held and fetched are announced around the load, so the trainer
        never prunes a file this instance is still reading (a slow reload keeps it)."""
        if self.is_rejected(job_id, policy):
            return
        instance = self._instance_id
        await self._store.report_weights(job_id, instance, engine.policy_version,
                                         policy.version)
        started_s = time.perf_counter()
        try:
            await self._load_checked(job_id, engine, policy)
            if self.on_reload is not None and engine.policy_version == policy.version:
                self.on_reload(time.perf_counter() - started_s)  # a refusal is no reload
        finally:
            await self._store.report_weights(job_id, instance, engine.policy_version, -1)

    async def _load_checked(self, job_id: str, engine: Engine, policy: t.PolicyInfo) -> None:
        key = (job_id, policy.version, policy.sha256)
        if policy.weights_path.endswith(MANIFEST_SUFFIX):
            await self._load_manifest(job_id, engine, policy)
            return
        try:
            digest = await asyncio.to_thread(sha256_file, Path(policy.weights_path))
        except OSError:  # missing or unreadable: as untrustworthy as a wrong checksum
            digest = ""
        if digest != policy.sha256:
            self._rejected.add(key)
            logger.error("[weights] checksum mismatch version=%d path=%s", policy.version,
                         policy.weights_path)
            await self._store.record_event(job_id, "weights_checksum_mismatch",
                                           version=str(policy.version),
                                           instance=self._instance_id)
            return
        await asyncio.to_thread(engine.load_weights, policy.weights_path, policy.version)

    async def _load_manifest(self, job_id: str, engine: Engine, policy: t.PolicyInfo) -> None:
        """Fetch and verify a chunked version within the deadline, then swap it in whole.

        Only the fetch runs under the deadline: the swap itself is one in-memory
        ``load_state_dict`` between engine calls, so a model is never half old, half new.
        A refused version is reported once (error event) and the old weights keep serving
        until a newer version is published.
        """
        key = (job_id, policy.version, policy.sha256)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.load_deadline_s):
                weights = await self._fetch_verified(job_id, policy)
        except LibraError as exc:
            # The trainer unreachable through the fetcher's retries: not the version's
            # fault, so it is not refused; the next pass resumes the transfer.
            logger.error("[weights] weights_fetch_failed version=%d error=%s",
                         policy.version, exc)
            await self._store.record_event(job_id, "weights_fetch_failed",
                                           version=str(policy.version),
                                           instance=self._instance_id, error=str(exc))
            return
        except (WeightSyncError, TimeoutError) as exc:
            self._rejected.add(key)
            kind = ("weights_load_timeout" if isinstance(exc, TimeoutError)
                    else "weights_checksum_mismatch")
            logger.error("[weights] %s version=%d error=%s", kind, policy.version, exc)
            await self._store.record_event(job_id, kind, version=str(policy.version),
                                           instance=self._instance_id,
                                           error=str(exc) or kind)
            return
        if isinstance(weights, Path):
            size_bytes = (await asyncio.to_thread(weights.stat)).st_size
            await asyncio.to_thread(engine.load_weights, str(weights), policy.version)
        else:
            size_bytes = len(weights)
            await asyncio.to_thread(engine.load_weights_bytes, weights, policy.version)
        reload_s = time.perf_counter() - started
        await self._store.record_event(job_id, "weights_loaded", version=str(policy.version),
                                       instance=self._instance_id,
                                       reload_s=f"{reload_s:.4f}",
                                       size_bytes=str(size_bytes))

    async def _fetch_verified(self, job_id: str, policy: t.PolicyInfo) -> bytes | Path:
        """The version's weights, verified: the file of a copy the fetcher hashed as it
        arrived against this pointer's manifest (the engine maps it: no read-back into a
        second buffer), else the bytes of the shared path or a cached copy, read and
        hashed here (what is loaded is what was hashed)."""
        if self._source is None:
            return await asyncio.to_thread(read_verified, Path(policy.weights_path),
                                           policy.sha256)
        fetched = await self._source.weights(job_id, policy)
        if fetched.verified and fetched.manifest_sha256 == policy.sha256:
            return await asyncio.to_thread(verified_weights, fetched)
        return await asyncio.to_thread(read_verified, fetched.manifest_path, policy.sha256)
