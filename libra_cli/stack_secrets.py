"""Credentials of a local stack (``libra up`` / ``libra run``), kept in the run root.

``<run_root>/.libra/secrets/`` (mode 0700) holds one 0600 file per secret: the api token
(the job API: what the CLI sends), the service token (internal RPCs between services) and
the Redis password. They are generated once and reused by later ``libra up`` calls on the
same run root, so a CLI started in another shell finds them without any setting.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

TOKEN_BYTES = 32  # 256 bits, URL-safe base64 (43 characters)
NAMES = ("api_token", "service_token", "redis_password")


@dataclass(frozen=True)
class StackSecrets:
    """Paths of the stack's secret files (each 0600, one line)."""

    root: Path

    @property
    def api_token_file(self) -> Path:
        return self.root / "api_token"

    @property
    def service_token_file(self) -> Path:
        return self.root / "service_token"

    @property
    def redis_password_file(self) -> Path:
        return self.root / "redis_password"

    def read(self, name: str) -> str:
        """One secret's value ('' when the file is absent)."""
        path = self.root / name
        return path.read_text().strip() if path.is_file() else ""


def secrets_dir(run_root: Path) -> Path:
    return run_root / ".libra" / "secrets"


def ensure_stack_secrets(run_root: Path) -> StackSecrets:
    """Create missing secrets (random, 0600) and return their paths."""
    root = secrets_dir(run_root)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    for name in NAMES:
        path = root / name
        if path.is_file() and path.read_text().strip():
            os.chmod(path, 0o600)  # tighten a file copied in with looser bits
            continue
        path.unlink(missing_ok=True)
        # O_EXCL with the mode at creation: the secret is never readable by others.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_urlsafe(TOKEN_BYTES) + "\n")
    return StackSecrets(root)


def stack_secrets(run_root: Path) -> StackSecrets | None:
    """The secrets of the stack under ``run_root``, or None when it has none."""
    root = secrets_dir(run_root)
    return StackSecrets(root) if root.is_dir() else None
