"""Who may call what: the one access table, token loading and the exposure rule.

Every gRPC method of every Libra service is one of three classes:

* ``OPEN``: health checks and reflection (liveness probes and tooling need no token);
* ``PUBLIC``: the job API a user calls (the api token or the service token);
* ``INTERNAL``: everything else - leases, step reports, worker roles, lend/reclaim,
  trainer and scheduler control, the tool gateway, rollouts (the service token only).

The method lists come from the generated proto descriptors: ``PUBLIC_METHODS`` names the
public methods by service, every other method found in the descriptors is internal, and a
method the table does not know (a newer proto) is internal too, so a new RPC is locked
until someone decides it is public. No grpc import here: the gRPC interceptor
(``libra.grpc_auth``) and the REST dependency (``services/coordinator/rest.py``) share it.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from libra.service_config import AuthConfig

logger = logging.getLogger(__name__)


class Access(enum.Enum):
    """Who may call a method: anyone (OPEN: health, reflection), the api token (PUBLIC: the
    job API) or only the service token (INTERNAL: worker RPCs)."""

    OPEN = "open"
    PUBLIC = "public"
    INTERNAL = "internal"


# The job API. Any job method added to CoordinatorService must be listed here to be
# callable with the api token (unlisted methods stay internal: safe by default).
PUBLIC_METHODS: dict[str, frozenset[str]] = {
    "libra.proto.coordinator.v1.CoordinatorService": frozenset(
        {"CreateJob", "GetJob", "ListJobs", "CancelJob", "ResumeJob", "ListWorkers"}),
}
OPEN_SERVICES = frozenset({
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
})


def method_access(full_method: str) -> Access:
    """The access class of ``/package.Service/Method`` (the gRPC method path)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    if service in OPEN_SERVICES:
        return Access.OPEN
    if method in PUBLIC_METHODS.get(service, frozenset()):
        return Access.PUBLIC
    return Access.INTERNAL


def libra_methods() -> dict[str, Access]:
    """Every method of every Libra gRPC service, from the proto descriptors, with its
    access class (``/package.Service/Method`` -> Access)."""
    from libra.proto.coordinator.v1 import coordinator_pb2
    from libra.proto.rollout.v1 import rollout_pb2
    from libra.proto.scheduler.v1 import scheduler_pb2
    from libra.proto.toolgateway.v1 import toolgateway_pb2
    from libra.proto.trainer.v1 import trainer_pb2

    out: dict[str, Access] = {}
    for module in (coordinator_pb2, rollout_pb2, scheduler_pb2, toolgateway_pb2, trainer_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                out[path] = method_access(path)
    return out


def read_secret(value: str, path: str, name: str) -> str:
    """A token from its file (first line, stripped) when ``path`` is set, else ``value``.

    Raises ValueError naming the option when the file is missing or empty: a typo in a
    path must not silently turn authentication off.
    """
    return read_secrets(value, path, name)[0] if path else value.strip()


def read_secrets(value: str, path: str, name: str) -> tuple[str, ...]:
    """Every token of a token file (one per line; blank lines and ``#`` comments
    skipped), the first being the one a client sends; ``(value,)`` without a file.

    Several lines let a token be rotated without a restart (docs/operations.md,
    "Rotating tokens"). Raises ValueError naming the option when the file is missing or
    holds no token.
    """
    if not path:
        return (value.strip(),) if value.strip() else ()
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"config auth.{name}_file: {path} is not a file")
    lines = [line.strip() for line in file.read_text().splitlines()]
    found = tuple(line for line in lines if line and not line.startswith("#"))
    if not found:
        raise ValueError(f"config auth.{name}_file: {path} is empty")
    return found


@dataclass(frozen=True)
class Tokens:
    """The resolved tokens of one process (empty string: not set).

    ``api``/``service`` are the first token of each kind (what this process sends);
    ``more_api``/``more_service`` are further tokens accepted too (the old or the next
    one while a token is rotated).
    """

    api: str = ""
    service: str = ""
    more_api: tuple[str, ...] = ()
    more_service: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        """Tokens are configured, so calls must present one (no tokens: an open, loopback-only
        stack)."""
        return bool(self.api or self.service)

    def current(self) -> Tokens:
        """Itself (a fixed set; :class:`TokenStore` gives the newest of a changing one)."""
        return self

    def classify(self, presented: str) -> Access | None:
        """What ``presented`` may call: INTERNAL (a service token: everything), PUBLIC
        (an api token), or None (no valid token). Constant-time comparisons, every
        token compared (no early exit that would tell which one matched)."""
        if _matches(presented, (self.service, *self.more_service)):
            return Access.INTERNAL
        if _matches(presented, (self.api, *self.more_api)):
            return Access.PUBLIC
        return None

    def allows(self, presented: str, needed: Access) -> Access | None:
        """None when allowed; otherwise the refusal: OPEN stands for "unauthenticated"
        (no valid token), PUBLIC for "authenticated but not permitted"."""
        if needed is Access.OPEN or not self.enabled:
            return None
        granted = self.classify(presented)
        if granted is None:
            return Access.OPEN
        if needed is Access.INTERNAL and granted is not Access.INTERNAL:
            return Access.PUBLIC
        return None


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _matches(presented: str, tokens: tuple[str, ...]) -> bool:
    hits = [_equal(presented, token) for token in tokens if token]
    return any(hits)


def load_tokens(cfg: AuthConfig) -> Tokens:
    """The tokens of ``cfg`` (files read now). Raises ValueError naming the option."""
    api = read_secrets(cfg.api_token, cfg.api_token_file, "api_token")
    service = read_secrets(cfg.service_token, cfg.service_token_file, "service_token")
    return Tokens(api=api[0] if api else "", service=service[0] if service else "",
                  more_api=api[1:], more_service=service[1:])


# How often a TokenStore looks at its files' mtimes (one stat per file per interval).
TOKEN_CHECK_INTERVAL_S = 1.0


class TokenStore:
    """The tokens of ``cfg``, re-read when a token file changes (no restart needed).

    Each :meth:`current` looks at the files' (mtime, size, inode) at most once per
    ``TOKEN_CHECK_INTERVAL_S``. A changed file that cannot be used (missing, empty,
    half-written by an editor) keeps the previous tokens and logs a warning: a
    rotation mistake must not turn authentication off or lock every caller out.
    Whether auth is on at all is fixed at start-up.
    """

    def __init__(self, cfg: AuthConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg = cfg
        self._clock = clock
        self._files = [f for f in (cfg.api_token_file, cfg.service_token_file) if f]
        self._tokens = load_tokens(cfg)
        self._stamp = self._stamps()
        self._checked_at_s = clock()

    def current(self) -> Tokens:
        """The tokens in force, re-reading the files when they changed (at most once per
        ``TOKEN_CHECK_INTERVAL_S``; a broken file keeps the previous tokens)."""
        now_s = self._clock()
        if self._files and now_s - self._checked_at_s >= TOKEN_CHECK_INTERVAL_S:
            self._checked_at_s = now_s
            stamp = self._stamps()
            if stamp != self._stamp:
                self._stamp = stamp
                self._reload()
        return self._tokens

    def _reload(self) -> None:
        try:
            tokens = load_tokens(self._cfg)
        except (OSError, ValueError) as exc:
            logger.warning("[auth] token file changed but cannot be used (%s); keeping "
                           "the previous tokens", exc)
            return
        if tokens != self._tokens:
            self._tokens = tokens
            logger.info("[auth] token files reloaded: api tokens=%d service tokens=%d",
                        int(bool(tokens.api)) + len(tokens.more_api),
                        int(bool(tokens.service)) + len(tokens.more_service))

    def _stamps(self) -> tuple[tuple[int, int, int] | None, ...]:
        out = []
        for path in self._files:
            try:
                st = os.stat(Path(path).expanduser())
                out.append((st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append(None)
        return tuple(out)


def bearer(header: str) -> str:
    """The token of an ``authorization: Bearer <token>`` value ('' when malformed)."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps a server reachable from this machine only."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name or "0.0.0.0"-like wildcard resolves beyond loopback


def check_exposure(host: str, tokens: Tokens, option_prefix: str = "") -> None:
    """Refuse to serve beyond loopback without a service token (secure by default).

    Raises ValueError saying what to set.
    """
    if is_loopback(host) or tokens.service:
        return
    prefix = option_prefix.upper()
    raise ValueError(
        f"server.host={host} binds beyond loopback but no service token is set: set "
        f"auth.service_token_file (env LIBRA_{prefix}AUTH__SERVICE_TOKEN_FILE) or "
        f"auth.service_token (LIBRA_{prefix}AUTH__SERVICE_TOKEN), and auth.api_token for "
        "the job API (docs/operations.md, Security; `libra certs` makes TLS files)")
