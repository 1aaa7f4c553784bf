"""Subprocess sandbox: runs untrusted Python in a fresh, contained process per call.

Where it sits: the ``python`` tool and the ``code_tests`` reward call
``Sandbox.run(code, timeout_s=...)``; nothing else in the gateway runs code in another
process (file_access.py forks only to open a job's files as an unprivileged uid).

Containment, set up in the child between fork and exec (``preexec_fn``), in this order:

1. New session (``start_new_session``): the code gets its own process group, so a
   wall-clock timeout kills everything it spawned with one ``os.killpg``, and its own
   ``os.killpg(os.getpgid(0))`` only hits itself.
2. ``unshare(CLONE_NEWNET | CLONE_NEWNS)`` through libc (Python 3.11 has no
   ``os.unshare``), when the kernel allows it (probed once, see ``probe_isolation``, isolation.py):
   the new network namespace has only a loopback that is down, so every connect fails.
3. In the private mount namespace: a size-capped tmpfs over each world-writable dir
   (``/tmp``, ``/var/tmp``, ``/dev/shm``), so stray writes vanish with the call; the
   call's working dir and the interpreter's install prefix are bind-mounted back
   (the prefix because it may live under a dir the sandbox uid cannot traverse).
4. ``setrlimit``: CPU, AS (memory), FSIZE, NPROC, NOFILE, and CORE=0 (no core files
   from ``os.abort`` or segfaults).
5. When the gateway runs as root: drop to a per-call unprivileged uid/gid from a pool.
   Why: RLIMIT_NPROC counts processes per real uid and is ignored for root, so a fork
   bomb is only bounded under a non-root uid; a uid unique per concurrent call also
   means one call cannot read another call's 0700 working dir or signal its
   processes, nor signal the (root) gateway.

After the process exits or times out: ``killpg(SIGKILL)`` for leftovers in the group,
then ``kill -KILL -1`` run *as that uid* to reap processes that left the group with
``setsid`` (the kernel resolves "every process of this uid"), then the working dir is
removed. The call ends with the tool's own exit: its output pipes are the sandbox's own
(``OutputPipe``, output_pipe.py), so a process that inherited them cannot hold the call;
they get ``kill_grace_s`` to reach EOF after the kills. Output is read incrementally and capped;
past the cap the group is killed. Killed processes that had left the call are zombies of
whoever adopted them; where that is this process, they are reaped around each call
(orphans.py: the gateway adopts them, so their uids come back whoever PID 1 is).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from libra.types import ToolStatus
from services.toolgateway.isolation import (
    CLONE_NEWNET,
    CLONE_NEWNS,
    ChildPlan,
    IsolationSupport,
    IsolationUnavailable,
    UidPool,
    child_setup,
    probe_isolation,
)
from services.toolgateway.orphans import OrphanReaper
from services.toolgateway.output_pipe import GroupKiller, OutputPipe, decode_output

logger = logging.getLogger(__name__)

def _default_env() -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


@dataclass(frozen=True, kw_only=True, slots=True)
class SandboxConfig:
    """Limits and isolation switches of ``SubprocessSandbox``."""

    python_executable: str = sys.executable
    """Interpreter that runs the code (started with ``-I -S -B``)."""
    max_output_bytes: int = 65536
    """Cap per stream (stdout, stderr); past it the process group is killed."""
    memory_limit_bytes: int = 512 * 1024 * 1024
    """RLIMIT_AS of the child."""
    max_file_bytes: int = 16 * 1024 * 1024
    """RLIMIT_FSIZE: largest file the code may write."""
    max_processes: int = 32
    """RLIMIT_NPROC: enforced only under the unprivileged uid (see module docstring)."""
    max_open_files: int = 64
    """RLIMIT_NOFILE of the child."""
    tmpfs_size_bytes: int = 64 * 1024 * 1024
    """Size of each private tmpfs mounted over ``masked_dirs``."""
    masked_dirs: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm")
    """World-writable dirs hidden behind a private tmpfs when mount namespaces work."""
    work_root_dir: str = os.path.join(tempfile.gettempdir(), "libra-sandbox")
    """Parent of the per-call working dirs."""
    require_network_isolation: bool = False
    """Fail construction instead of warning when network namespaces are unavailable."""
    enable_uid_drop: bool = True
    """Run the code as a per-call unprivileged uid when the gateway runs as root."""
    uid_base: int = 990_000
    """First uid (and gid) of the pool; pick a range no real account uses."""
    num_uids: int = 256
    """Pool size: the most sandboxes that may run at once."""
    kill_grace_s: float = 1.0
    """How long the output pipes may stay open once the process exited and its group
    and uid were killed (then they are closed and the output counts as truncated): only
    a process the kills could not reach (no uid drop) keeps them open that long."""
    env: Mapping[str, str] = field(default_factory=_default_env)
    """The child's complete environment (plus HOME = working dir); nothing is inherited."""

    def __post_init__(self) -> None:
        if self.max_output_bytes <= 0 or self.num_uids <= 0 or self.max_processes <= 0:
            raise ValueError(
                "max_output_bytes, num_uids and max_processes must be > 0, got "
                f"{self.max_output_bytes} / {self.num_uids} / {self.max_processes}"
            )


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """How one sandboxed run ended."""

    status: ToolStatus
    exit_code: int | None
    """Exit status, or None when a signal ended the process."""
    signal: int | None
    """Number of the signal that ended the process, if any."""
    stdout: str
    stderr: str
    error: str
    """Short lowercase reason when not successful ("timeout", "exit code 1", ...)."""
    is_output_truncated: bool
    duration_ms: int


class Sandbox(Protocol):
    """Runs a Python program in isolation (the seam tools and rewards depend on)."""

    async def run(self, code: str, *, timeout_s: float) -> SandboxResult:
        """Run ``code`` as a script; never raises for what the code does."""
        ...


def _classify(returncode: int, reason: str | None) -> tuple[ToolStatus, str, int | None]:
    """Map the exit to (status, short error, signal number)."""
    sig = -returncode if returncode < 0 else None
    if reason == "timeout" or sig == signal.SIGXCPU:
        return ToolStatus.TIMEOUT, "timeout", sig
    if reason is not None:
        return ToolStatus.FAILURE, reason, sig
    if sig is not None:
        return ToolStatus.FAILURE, f"killed by {signal.Signals(sig).name}", sig
    if returncode != 0:
        return ToolStatus.FAILURE, f"exit code {returncode}", None
    return ToolStatus.SUCCESS, "", None


class SubprocessSandbox:
    """``Sandbox`` that starts one contained interpreter process per call."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        """Probe isolation support once and fail fast on a config this host cannot meet.

        Raises:
            IsolationUnavailable: ``require_network_isolation`` is set but network
                namespaces are not available.
        """
        self._config = config or SandboxConfig()
        self._support = probe_isolation()
        self._init_isolation()
        os.makedirs(self._config.work_root_dir, mode=0o711, exist_ok=True)
        self._uids = UidPool(self._config.uid_base, self._config.num_uids,
                              os.path.join(self._config.work_root_dir, ".uid-locks"))
        self._orphans = OrphanReaper()

    def _init_isolation(self) -> None:
        cfg, sup = self._config, self._support
        if not sup.has_netns:
            msg = "network namespaces unavailable: sandboxed code CAN open network connections"
            if cfg.require_network_isolation:
                raise IsolationUnavailable(msg + " (require_network_isolation=True)")
            logger.warning("[startup] %s", msg)
        self._is_uid_drop = cfg.enable_uid_drop and sup.is_root
        if not self._is_uid_drop:
            logger.warning("[startup] sandbox runs code as uid=%d: RLIMIT_NPROC and "
                           "cross-call isolation rely on the process group only", os.geteuid())
        self._unshare_flags = (CLONE_NEWNET if sup.has_netns else 0) | (
            CLONE_NEWNS if sup.has_mountns else 0)
        self._kill_binary = shutil.which("kill", path=cfg.env.get("PATH"))

    @property
    def support(self) -> IsolationSupport:
        """What isolation this host allowed (probed at construction)."""
        return self._support

    @property
    def orphans(self) -> OrphanReaper:
        """The reaper of the calls' leftovers (it spares the tool processes in flight):
        the gateway also runs it between calls (``orphans.reap_every``)."""
        return self._orphans

    async def run(self, code: str, *, timeout_s: float) -> SandboxResult:
        """Run ``code`` as ``main.py`` in a fresh private working dir; see module docstring."""
        self._orphans.reap()  # an earlier call's killed leftovers: their uid comes back
        uid = self._uids.acquire() if self._is_uid_drop else None
        workdir = tempfile.mkdtemp(prefix="call-", dir=self._config.work_root_dir)
        try:
            self._prepare_workdir(workdir, code, uid)
            return await self._spawn_and_wait(workdir, uid, timeout_s)
        finally:
            if uid is not None:
                # The uid's processes were killed at the exit (_spawn_and_wait); one
                # still dying or not yet reaped keeps it from the next call (UidPool).
                self._uids.release(uid)
            shutil.rmtree(workdir, ignore_errors=True)

    def _prepare_workdir(self, workdir: str, code: str, uid: int | None) -> None:
        script = os.path.join(workdir, "main.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        if uid is not None:
            os.chown(script, uid, uid)
            os.chown(workdir, uid, uid)  # dir stays 0700: other calls' uids cannot enter

    def _plan(self, workdir: str, uid: int | None, timeout_s: float) -> tuple[ChildPlan, str]:
        cfg = self._config
        exe = os.path.realpath(cfg.python_executable)
        masked = tuple(d for d in cfg.masked_dirs if os.path.isdir(d))
        prefix_src = prefix_dst = None
        if self._unshare_flags & CLONE_NEWNS and masked:
            prefix_src = os.path.dirname(os.path.dirname(exe))
            prefix_dst = os.path.join(masked[0], ".libra-python")
            exe = os.path.join(prefix_dst, os.path.relpath(exe, prefix_src))
        limits = (
            (resource.RLIMIT_CPU, math.ceil(timeout_s) + 1),
            (resource.RLIMIT_AS, cfg.memory_limit_bytes),
            (resource.RLIMIT_FSIZE, cfg.max_file_bytes),
            (resource.RLIMIT_NPROC, cfg.max_processes),
            (resource.RLIMIT_NOFILE, cfg.max_open_files),
            (resource.RLIMIT_CORE, 0),
        )
        plan = ChildPlan(
            unshare_flags=self._unshare_flags, workdir=workdir, masked_dirs=masked,
            tmpfs_options=f"size={cfg.tmpfs_size_bytes},mode=1777".encode(),
            prefix_src=prefix_src, prefix_dst=prefix_dst, limits=limits, uid=uid,
        )
        return plan, exe

    async def _spawn_and_wait(self, workdir: str, uid: int | None,
                              timeout_s: float) -> SandboxResult:
        plan, exe = self._plan(workdir, uid, timeout_s)
        start_s = time.monotonic()
        out, err = OutputPipe(), OutputPipe()
        try:
            proc = await self._spawn(exe, workdir, plan, out, err)
            killer = GroupKiller(proc.pid)
            try:
                for pipe in (out, err):
                    await pipe.start_reading(self._config.max_output_bytes, killer)
                returncode = await self._wait_exit(proc, killer, timeout_s)
            finally:
                # Always, also on cancellation: background children, in the group or
                # out of it, would keep running (and keep the pipes open).
                killer.kill(None)
                if uid is not None:
                    await self._kill_uid(uid)
                self._orphans.reap()  # those already dead; the next call reaps the rest
            truncated = await self._drain(out, err)
        finally:
            out.close()
            err.close()
        status, error, sig = _classify(returncode, killer.reason)
        return SandboxResult(
            status=status, exit_code=None if returncode < 0 else returncode, signal=sig,
            stdout=decode_output(out.buf, truncated[0]),
            stderr=decode_output(err.buf, truncated[1]),
            error=error, is_output_truncated=any(truncated),
            duration_ms=int((time.monotonic() - start_s) * 1000),
        )

    async def _spawn(self, exe: str, workdir: str, plan: ChildPlan, out: OutputPipe,
                     err: OutputPipe) -> asyncio.subprocess.Process:
        with self._orphans.spawning() as spared:  # asyncio waits for it, not the reaper
            try:
                proc = await asyncio.create_subprocess_exec(
                    exe, "-I", "-S", "-B", "main.py", stdin=asyncio.subprocess.DEVNULL,
                    stdout=out.write_fd, stderr=err.write_fd, cwd=workdir,
                    env={**self._config.env, "HOME": workdir}, start_new_session=True,
                    preexec_fn=functools.partial(child_setup, plan),
                )
            finally:
                out.close_write_end()
                err.close_write_end()
            spared.add(proc.pid)
        return proc

    @staticmethod
    async def _wait_exit(proc: asyncio.subprocess.Process, killer: GroupKiller,
                         timeout_s: float) -> int:
        """The tool's exit status once it exited, or was killed at ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                return await proc.wait()  # the exit only: the pipes are not asyncio's
        except TimeoutError:
            killer.kill("timeout")
            with contextlib.suppress(ProcessLookupError):
                proc.kill()  # in case it moved itself to another group of its session
        return await proc.wait()

    async def _drain(self, out: OutputPipe, err: OutputPipe) -> tuple[bool, bool]:
        """Read to EOF for at most ``kill_grace_s``; a pipe still open then is cut (the
        caller closes it) and counts as truncated."""
        readers = [p.reader for p in (out, err) if p.reader is not None]
        done, _ = await asyncio.wait(readers, timeout=self._config.kill_grace_s)
        flags = [r.result() if r in done else True for r in readers]
        return flags[0], flags[1]

    async def _kill_uid(self, uid: int) -> None:
        """Kill every process of ``uid``, including ones that left the process group."""
        if self._kill_binary is None:
            return
        helper = await asyncio.create_subprocess_exec(
            self._kill_binary, "-KILL", "-1", user=uid, group=uid, extra_groups=[],
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await helper.wait()
