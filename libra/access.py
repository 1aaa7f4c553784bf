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
from dataclasses import dataclass
from pathlib import Path

from libra.service_config import AuthConfig


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
    if not path:
        return value.strip()
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"config auth.{name}_file: {path} is not a file")
    text = file.read_text().strip()
    if not text:
        raise ValueError(f"config auth.{name}_file: {path} is empty")
    return text.splitlines()[0].strip()


@dataclass(frozen=True)
class Tokens:
    """The resolved tokens of one process (empty string: not set)."""

    api: str = ""
    service: str = ""

    @property
    def enabled(self) -> bool:
        """Tokens are configured, so calls must present one (no tokens: an open, loopback-only
        stack)."""
        return bool(self.api or self.service)

    def classify(self, presented: str) -> Access | None:
        """What ``presented`` may call: INTERNAL (service token: everything), PUBLIC
        (api token), or None (no valid token). Constant-time comparisons."""
        if self.service and _equal(presented, self.service):
            return Access.INTERNAL
        if self.api and _equal(presented, self.api):
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


def load_tokens(cfg: AuthConfig) -> Tokens:
    """The tokens of ``cfg`` (files read now). Raises ValueError naming the option."""
    return Tokens(api=read_secret(cfg.api_token, cfg.api_token_file, "api_token"),
                  service=read_secret(cfg.service_token, cfg.service_token_file,
                                      "service_token"))


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
