"""Where and how a service exports spans: the OpenTelemetry environment conventions
(pure: reads a mapping, imports neither grpc nor the SDK).

Users set the same variables for every OTel program (a hosted backend's API key, its
TLS roots, gzip), so the services honour them, for trajectory spans and for the
SDK's gRPC/Redis spans alike (docs/observability.md, "Exporter settings"):

- ``OTEL_EXPORTER_OTLP_TRACES_<X>`` wins over ``OTEL_EXPORTER_OTLP_<X>`` for each X of
  ENDPOINT, HEADERS, CERTIFICATE, CLIENT_KEY, CLIENT_CERTIFICATE, INSECURE, COMPRESSION,
  TIMEOUT; ``telemetry.otlp_endpoint`` (Libra's own setting) wins over both endpoints.
- ``OTEL_SDK_DISABLED=true``: the service exports no spans at all.
- ``OTEL_TRACES_SAMPLER`` (+ ``_ARG``): the SDK sampler of gRPC/Redis spans, and the
  share of trajectories traced for jobs that leave ``trace_sample_ratio`` automatic.

A bad value is an :class:`libra.errors.InvalidArgument` naming the variable, raised at
start-up: a service must not run on half of what its operator configured.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from libra.errors import InvalidArgument

logger = logging.getLogger(__name__)

_PREFIX = "OTEL_EXPORTER_OTLP_"
_TRACES_PREFIX = "OTEL_EXPORTER_OTLP_TRACES_"
SAMPLER = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"
SDK_DISABLED = "OTEL_SDK_DISABLED"
DEFAULT_PORT = 4317  # OTLP/gRPC
# The samplers the specification names for OTEL_TRACES_SAMPLER (vendor ones need their
# own packages, which the services do not ship).
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on",
            "parentbased_always_off", "parentbased_traceidratio")
# The SDK sampler when OTEL_TRACES_SAMPLER is unset (the services then patch neither gRPC
# nor Redis, so it only sees spans of their own: dropped unless a caller sampled). The
# SDK's own default (parentbased_always_on) made every Redis command and gRPC call of
# every polling loop a trace: on the demo 14-21 spans per trajectory beside its ~7
# trajectory spans (docs/observability.md, "Cost").
DEFAULT_LIBRARY_SAMPLER = "parentbased_always_off"


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    """One service's OTLP/gRPC export: ``target`` is ``host:port`` (no scheme)."""

    target: str
    tls: bool
    ca_pem: bytes = b""  # trusted roots ("" with TLS: the system's)
    client_key_pem: bytes = b""  # mutual TLS
    client_cert_pem: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    gzip: bool = False
    timeout_s: float = 5.0
    endpoint_variable: str = "telemetry.otlp_endpoint"  # where the endpoint came from


@dataclass(frozen=True, slots=True)
class SamplerSettings:
    """``OTEL_TRACES_SAMPLER`` as read: ``name`` one of :data:`SAMPLERS` ("" unset)."""

    name: str = ""
    ratio: float = 1.0  # OTEL_TRACES_SAMPLER_ARG of the ratio samplers

    @property
    def library_sampler(self) -> str:
        """The sampler of the SDK's gRPC/Redis spans."""
        return self.name or DEFAULT_LIBRARY_SAMPLER

    @property
    def trajectory_ratio(self) -> float | None:
        """The share of trajectories to trace where the job leaves it automatic; None:
        Libra's own per-step budget (no sampler set)."""
        if not self.name:
            return None
        if self.name.endswith("traceidratio"):
            return self.ratio
        return 1.0 if self.name.endswith("always_on") else 0.0


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """How trajectory spans are batched (the ``OTEL_BSP_*`` variables of the SDK's batch
    processor, which reads them itself for gRPC/Redis spans)."""

    interval_s: float = 2.0  # OTEL_BSP_SCHEDULE_DELAY (the SDK's default is 5 s)
    max_queue_spans: int = 8192  # OTEL_BSP_MAX_QUEUE_SIZE (the SDK's: 2048)
    batch_size: int = 512  # OTEL_BSP_MAX_EXPORT_BATCH_SIZE


def read_batch(env: Mapping[str, str]) -> BatchSettings:
    """``OTEL_BSP_SCHEDULE_DELAY`` (ms), ``OTEL_BSP_MAX_QUEUE_SIZE``,
    ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` (at most the queue size)."""
    default = BatchSettings()
    delay_ms = _positive(env, "OTEL_BSP_SCHEDULE_DELAY", default.interval_s * 1000)
    queue = int(_positive(env, "OTEL_BSP_MAX_QUEUE_SIZE", default.max_queue_spans, True))
    batch = int(_positive(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", min(default.batch_size,
                                                                      queue), True))
    if batch > queue:
        raise InvalidArgument("OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                              f"{batch} is more than OTEL_BSP_MAX_QUEUE_SIZE ({queue})")
    return BatchSettings(delay_ms / 1000, queue, batch)


def _positive(env: Mapping[str, str], variable: str, default: float,
              integer: bool = False) -> float:
    value = env.get(variable, "").strip()
    if not value:
        return default
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        raise InvalidArgument(variable, f"{value!r} is not a{'n integer' if integer else ' number'}"
                              ) from None
    if not math.isfinite(number) or number <= 0:
        raise InvalidArgument(variable, f"{value!r}: more than 0")
    return number


def sdk_disabled(env: Mapping[str, str]) -> bool:
    """``OTEL_SDK_DISABLED`` is true (case-insensitive); any other value but "false" or
    empty is warned about and read as false, as the specification says."""
    value = env.get(SDK_DISABLED, "").strip().lower()
    if value not in ("", "true", "false"):
        logger.warning("[trace] %s=%r is neither true nor false: read as false",
                       SDK_DISABLED, value)
    return value == "true"


def read_sampler(env: Mapping[str, str]) -> SamplerSettings:
    """``OTEL_TRACES_SAMPLER`` and its ratio argument."""
    name = env.get(SAMPLER, "").strip().lower()
    if not name:
        return SamplerSettings()
    if name not in SAMPLERS:
        raise InvalidArgument(SAMPLER, f"{name!r} is not one of {', '.join(SAMPLERS)}")
    ratio = 1.0
    arg = env.get(SAMPLER_ARG, "").strip()
    if name.endswith("traceidratio") and arg:
        try:
            ratio = float(arg)
        except ValueError:
            raise InvalidArgument(SAMPLER_ARG, f"{arg!r} is not a number") from None
        if not 0.0 <= ratio <= 1.0:
            raise InvalidArgument(SAMPLER_ARG, f"{arg!r} is not a ratio in [0, 1]")
    return SamplerSettings(name, ratio)


def _get(env: Mapping[str, str], key: str) -> tuple[str, str]:
    """The value of ``OTEL_EXPORTER_OTLP_TRACES_<key>``, else ``..._OTLP_<key>``, with
    the name it was read from ("" and the generic name when neither is set)."""
    for name in (_TRACES_PREFIX + key, _PREFIX + key):
        value = env.get(name, "").strip()
        if value:
            return value, name
    return "", _PREFIX + key


def read_settings(configured_endpoint: str, env: Mapping[str, str],
                  default_timeout_s: float) -> OtlpSettings | None:
    """The export settings, or None when no endpoint is set anywhere."""
    endpoint, endpoint_variable = configured_endpoint.strip(), "telemetry.otlp_endpoint"
    if not endpoint:
        endpoint, endpoint_variable = _get(env, "ENDPOINT")
    if not endpoint:
        return None
    target, scheme_tls = _target(endpoint, endpoint_variable)
    ca_file, ca_variable = _get(env, "CERTIFICATE")
    key_file, key_variable = _get(env, "CLIENT_KEY")
    cert_file, cert_variable = _get(env, "CLIENT_CERTIFICATE")
    if bool(key_file) != bool(cert_file):
        missing = cert_variable if key_file else key_variable
        raise InvalidArgument(missing, "a client key and a client certificate go together "
                                       "(mutual TLS): set both or neither")
    insecure, insecure_variable = _get(env, "INSECURE")
    if scheme_tls is not None:  # the scheme decides; INSECURE applies without one
        tls = scheme_tls
    elif insecure:
        tls = not _boolean(insecure, insecure_variable)
    else:  # Libra's "host:port" has always meant plaintext; certificates mean TLS
        tls = bool(ca_file or cert_file)
    return OtlpSettings(
        target=target, tls=tls, ca_pem=_pem(ca_file, ca_variable),
        client_key_pem=_pem(key_file, key_variable),
        client_cert_pem=_pem(cert_file, cert_variable),
        headers=_headers(*_get(env, "HEADERS")),
        gzip=_compression(*_get(env, "COMPRESSION")),
        timeout_s=_timeout_s(*_get(env, "TIMEOUT"), default_timeout_s),
        endpoint_variable=endpoint_variable)


def _target(endpoint: str, variable: str) -> tuple[str, bool | None]:
    """``host:port`` and whether the scheme asks for TLS (None: no scheme)."""
    scheme_tls: bool | None = None
    rest = endpoint
    if "://" in endpoint:
        scheme, rest = endpoint.split("://", 1)
        if scheme.lower() not in ("http", "https"):
            raise InvalidArgument(variable, f"{endpoint!r}: the scheme must be http:// "
                                            "(plaintext) or https:// (TLS)")
        scheme_tls = scheme.lower() == "https"
    rest = rest.split("/", 1)[0]  # a trailing slash or path: gRPC has no use for it
    if rest.startswith("["):  # an IPv6 literal, [::1]:4317
        host, _, port = rest.partition("]")
        host, port = host + "]", port.removeprefix(":")
    else:
        host, _, port = rest.partition(":")
    if not host or (port and not port.isdigit()):
        raise InvalidArgument(variable, f"{endpoint!r} is not host:port")
    default_port = 443 if scheme_tls else DEFAULT_PORT
    return f"{host}:{port or default_port}", scheme_tls


def _pem(path: str, variable: str) -> bytes:
    """The PEM file ``path`` names (read at start-up: a typo fails there, not at the
    first export), b"" for no path."""
    if not path:
        return b""
    try:
        with open(path, "rb") as file:
            pem = file.read()
    except OSError as exc:
        raise InvalidArgument(variable, f"cannot read {path!r}: {exc.strerror}") from None
    if b"-----BEGIN " not in pem:
        raise InvalidArgument(variable, f"{path!r} is not a PEM file")
    return pem


def _boolean(value: str, variable: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false"):
        raise InvalidArgument(variable, f"{value!r} is neither true nor false")
    return lowered == "true"


def _headers(value: str, variable: str) -> tuple[tuple[str, str], ...]:
    """``key=value`` pairs, comma-separated, percent-encoded (the W3C baggage form);
    keys lower case, as gRPC metadata wants them."""
    out = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, sep, raw = item.partition("=")
        key = unquote(key).strip().lower()
        if not sep or not key:
            raise InvalidArgument(variable, f"{item!r} is not key=value")
        if not all(c.isalnum() or c in "-_." for c in key):
            raise InvalidArgument(variable, f"header name {key!r}: only letters, digits, "
                                            "'-', '_' and '.'")
        out.append((key, unquote(raw).strip()))
    return tuple(out)


def _compression(value: str, variable: str) -> bool:
    lowered = value.lower()
    if lowered not in ("", "gzip", "none"):
        raise InvalidArgument(variable, f"{value!r}: gzip or none")
    return lowered == "gzip"


def _timeout_s(value: str, variable: str, default_s: float) -> float:
    """The specification's unit: milliseconds."""
    if not value:
        return default_s
    try:
        timeout_ms = float(value)
    except ValueError:
        raise InvalidArgument(variable, f"{value!r} is not a number of milliseconds"
                              ) from None
    if not math.isfinite(timeout_ms) or timeout_ms <= 0:
        raise InvalidArgument(variable, f"{value!r}: milliseconds, more than 0")
    return timeout_ms / 1000
