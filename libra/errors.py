"""Domain errors and their gRPC status codes.

Cores raise these; the server interceptor in ``libra.grpcx`` maps them to status codes
and clients in ``libra.clients`` map status codes back, so a caller sees the same class
the callee raised. Each class says whether a retry can help.
"""

from __future__ import annotations

import re


class LibraError(Exception):
    """Base class: a failure that is part of the API."""

    grpc_status_name: str = "INTERNAL"
    retryable: bool = False


class InvalidArgument(LibraError):
    """The request is malformed; the message names the field."""

    grpc_status_name = "INVALID_ARGUMENT"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class NotFound(LibraError):
    """The named job, worker or resource does not exist."""

    grpc_status_name = "NOT_FOUND"


class AlreadyExists(LibraError):
    """Creating something whose id is taken (a job id, a registered name)."""

    grpc_status_name = "ALREADY_EXISTS"


class FailedPrecondition(LibraError):
    """The call is valid but the state does not allow it now (a busy trainer, a job
    that is not running); retrying the same call will not help."""

    grpc_status_name = "FAILED_PRECONDITION"


class LeaseConflict(LibraError):
    """Another holder owns the lease, or the epoch moved on."""

    grpc_status_name = "ABORTED"


class LeaseLost(LibraError):
    """The caller's lease expired or was fenced off; it must re-register."""

    grpc_status_name = "PERMISSION_DENIED"


class Unauthenticated(LibraError):
    """No valid credential (bearer token) came with the call."""

    grpc_status_name = "UNAUTHENTICATED"


class PermissionDenied(LibraError):
    """A valid credential that may not call this method (the api token on an internal
    RPC). Shares its status with LeaseLost; clients tell them apart by the message."""

    grpc_status_name = "PERMISSION_DENIED"
    MESSAGE_PREFIX = "permission denied by access class: "


class ResourceExhausted(LibraError):
    """Capacity is full; retry after ``retry_after_ms``."""

    grpc_status_name = "RESOURCE_EXHAUSTED"
    retryable = True

    def __init__(self, message: str, retry_after_ms: int = 100) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class Unavailable(LibraError):
    """A peer or Redis cannot be reached now; retrying later may succeed."""

    grpc_status_name = "UNAVAILABLE"
    retryable = True


class DeadlineExceeded(LibraError):
    """The call ran past its deadline; it may or may not have taken effect."""

    grpc_status_name = "DEADLINE_EXCEEDED"
    retryable = True


class Internal(LibraError):
    """A bug or broken invariant on the server side; the message says which."""

    grpc_status_name = "INTERNAL"


# Errors of a backing service (Redis) that mean "unreachable right now", named by the
# adapter that owns that dependency (register_unavailable), so edges need not import it.
_UNAVAILABLE_TYPES: tuple[type[BaseException], ...] = ()


def register_unavailable(*types: type[BaseException]) -> None:
    """Name an adapter's errors that mean its backing service is unreachable (Redis
    connection and timeout errors). The service edges - the gRPC error interceptor and
    the REST app - then answer UNAVAILABLE / HTTP 503 for them (retryable) instead of an
    internal error. Code inside a service still sees the original exception."""
    global _UNAVAILABLE_TYPES
    _UNAVAILABLE_TYPES = tuple(dict.fromkeys((*_UNAVAILABLE_TYPES, *types)))


def unavailable_types() -> tuple[type[BaseException], ...]:
    """The registered outage error types (see :func:`register_unavailable`)."""
    return _UNAVAILABLE_TYPES


def as_unavailable(exc: BaseException) -> Unavailable | None:
    """``exc`` as an Unavailable when a registered type, else None."""
    if isinstance(exc, Unavailable):
        return exc
    if _UNAVAILABLE_TYPES and isinstance(exc, _UNAVAILABLE_TYPES):
        return Unavailable(f"a backing service is unreachable ({type(exc).__name__}: {exc}); "
                           "retry later")
    return None


_RETRY_AFTER = re.compile(r"retry after (\d+) ms")
_BY_STATUS: dict[str, type[LibraError]] = {
    cls.grpc_status_name: cls
    for cls in (NotFound, AlreadyExists, FailedPrecondition, LeaseConflict, LeaseLost,
                ResourceExhausted, Unavailable, DeadlineExceeded, Internal, Unauthenticated)
}


def error_from_status(code: str, details: str) -> LibraError:
    """Rebuild the domain error a server raised from its status code name and details."""
    if code == "INVALID_ARGUMENT":
        field, _, reason = details.partition(": ")
        return InvalidArgument(field, reason or details)
    if code == "RESOURCE_EXHAUSTED":
        # Servers put the hint in the details as "(retry after N ms)".
        hint = _RETRY_AFTER.search(details)
        return ResourceExhausted(details, int(hint.group(1)) if hint else 100)
    if code == "PERMISSION_DENIED" and details.startswith(PermissionDenied.MESSAGE_PREFIX):
        return PermissionDenied(details)
    return _BY_STATUS.get(code, Internal)(details)
