"""The one gRPC server helper: interceptors, health, reflection, metrics, graceful stop.

``serve`` follows the gRPC graceful-shutdown pattern: on SIGTERM/SIGINT the health
status flips to NOT_SERVING (so load balancers and the launcher stop sending work), the
service's own ``drain`` hook runs within the grace period, then the server stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from libra import metrics
from libra.access import TokenStore, check_exposure, is_loopback
from libra.cancellation import raise_if_cancelled, stop_task
from libra.errors import InvalidArgument, LibraError, as_unavailable
from libra.grpc_auth import AuthInterceptor, ClientAuth, open_channel, server_credentials
from libra.service_config import AuthConfig, ServerConfig

logger = logging.getLogger(__name__)

RPC_TOTAL = metrics.counter("libra_rpc_server_total")
RPC_SECONDS = metrics.histogram("libra_rpc_server_seconds")
REDIS_ROUNDTRIP_SECONDS = metrics.histogram("libra_redis_roundtrip_seconds")
# How often a service checks the dependency it cannot work without (its Redis).
HEALTH_PROBE_INTERVAL_S = 1.0
# Health service name answered SERVING for as long as the process serves (until SIGTERM),
# whatever its dependencies: the liveness probe of an orchestrator. The overall status
# ("") is readiness and goes NOT_SERVING while Redis is unreachable; a liveness probe on
# it would restart every service during a Redis outage, which restarting cannot fix.
LIVENESS_SERVICE = "liveness"


# Status details echo client strings ("spec_format: unknown format 'xxx...'"); past the
# peer's metadata limit (8 KiB by default) the whole status is lost and the caller sees
# RESOURCE_EXHAUSTED instead. The field name and reason come first, so a cut keeps them.
MAX_STATUS_DETAILS_CHARS = 2048


def status_details(exc: Exception) -> str:
    """The status details of ``exc``, clipped to MAX_STATUS_DETAILS_CHARS so the field name
    and reason survive the peer's metadata limit."""
    text = str(exc)
    if len(text) <= MAX_STATUS_DETAILS_CHARS:
        return text
    return f"{text[:MAX_STATUS_DETAILS_CHARS]}... ({len(text)} characters in all)"


class _Undecodable:
    """Stands in for a request whose bytes did not parse. grpc's own deserializer failure
    answers UNKNOWN and logs two tracebacks; this lets the handler wrapper answer
    INVALID_ARGUMENT naming ``request`` instead."""

    def __init__(self, reason: str) -> None:
        self.error = InvalidArgument("request", f"undecodable message: {reason}")


def _lenient(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def run(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return _Undecodable(str(exc))
    return run


async def _checked(request_iterator: Any) -> Any:
    async for request in request_iterator:
        if isinstance(request, _Undecodable):
            raise request.error
        yield request


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain errors to status codes and counts every RPC (unary, server and bidi
    streams)."""

    def __init__(self, service: str) -> None:
        self._service = service

    async def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001
        """Wrap the method's handler so domain errors become status codes and the RPC is counted."""
        handler = await continuation(handler_call_details)
        if handler is not None and handler.stream_stream is not None:
            return self._wrap_stream(handler, handler_call_details.method.rsplit("/", 1)[-1])
        if handler is not None and handler.unary_stream is not None:
            return self._wrap_stream(handler, handler_call_details.method.rsplit("/", 1)[-1],
                                     unary_request=True)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        inner = handler.unary_unary
        service = self._service

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            start = time.perf_counter()
            code = "OK"
            try:
                if isinstance(request, _Undecodable):
                    raise request.error
                return await inner(request, context)
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception as exc:
                # Domain errors (libra.errors, the one hierarchy every service raises)
                # declare their status by name; a registered outage is UNAVAILABLE.
                domain = as_unavailable(exc) or exc
                if isinstance(domain, LibraError):
                    code = domain.grpc_status_name
                    await context.abort(grpc.StatusCode[code], status_details(domain))
                if context.code() is None:  # not an abort raised by the handler itself
                    code = "INTERNAL"
                    logger.exception("[rpc] unhandled error method=%s", method)
                raise
            finally:
                RPC_TOTAL.labels(service, method, code).inc()
                RPC_SECONDS.labels(service, method).observe(time.perf_counter() - start)

        return grpc.unary_unary_rpc_method_handler(
            wrapped, request_deserializer=_lenient(handler.request_deserializer),
            response_serializer=handler.response_serializer)

    def _wrap_stream(self, handler: Any, method: str, unary_request: bool = False) -> Any:
        """A server-streaming method (``unary_request``: one request, a response stream)."""
        inner = handler.unary_stream if unary_request else handler.stream_stream
        service = self._service

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            code = "OK"
            try:
                if unary_request and isinstance(request, _Undecodable):
                    raise request.error
                responses = inner(request if unary_request else _checked(request), context)
                async for response in responses:
                    yield response
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            except Exception as exc:
                domain = as_unavailable(exc) or exc  # a registered outage: UNAVAILABLE
                if not isinstance(domain, LibraError):
                    code = "INTERNAL"
                    logger.exception("[rpc] unhandled error method=%s", method)
                    raise
                code = domain.grpc_status_name
                await context.abort(grpc.StatusCode[code], status_details(domain))
            finally:
                RPC_TOTAL.labels(service, method, code).inc()

        make = (grpc.unary_stream_rpc_method_handler if unary_request
                else grpc.stream_stream_rpc_method_handler)
        return make(wrapped, request_deserializer=_lenient(handler.request_deserializer),
                    response_serializer=handler.response_serializer)


@dataclass
class Registration:
    """One servicer: its ``add_XServicer_to_server`` function and full service name."""

    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any
    service_name: str


class Server:
    """A started gRPC server plus its health servicer and metrics port."""

    def __init__(self, service: str, cfg: ServerConfig, registrations: Iterable[Registration],
                 auth: AuthConfig | None = None):
        self.service = service
        self._cfg = cfg
        self._registrations = list(registrations)
        self._auth = auth or AuthConfig()
        tokens = TokenStore(self._auth)  # follows the token files (rotation)
        # Before binding anything: a server reachable from other hosts needs credentials.
        check_exposure(cfg.host, tokens.current(), f"{service.upper()}_")
        if not is_loopback(cfg.host) and not self._auth.tls_cert_file:
            logger.warning("[startup] service=%s binds %s without TLS: tokens travel in "
                           "plaintext (set auth.tls_cert_file/tls_key_file)", service, cfg.host)
        interceptors: list[grpc.aio.ServerInterceptor] = [ErrorInterceptor(service)]
        if tokens.current().enabled:  # first, so a refused call reaches no other interceptor
            interceptors.insert(0, AuthInterceptor(tokens))
        self.server = grpc.aio.server(interceptors=interceptors, options=server_options())
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.metrics_port = -1
        self._metrics_httpd: Any = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        """Register the servicers, health (and reflection), bind the port, serve, mark every
        service SERVING and start the metrics endpoint."""
        for reg in self._registrations:
            reg.add_to_server(reg.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [r.service_name for r in self._registrations]
        if self._cfg.enable_reflection:
            reflection.enable_server_reflection(
                [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                 reflection.SERVICE_NAME], self.server)
        address = f"{self._cfg.host}:{self._cfg.port}"
        creds = server_credentials(self._auth)
        self.port = (self.server.add_secure_port(address, creds) if creds is not None
                     else self.server.add_insecure_port(address))
        await self.server.start()
        for name in ["", LIVENESS_SERVICE, *names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self._cfg.metrics_port >= 0:
            self._metrics_httpd = _start_metrics(self._cfg.host, self._cfg.metrics_port)
            self.metrics_port = self._metrics_httpd.server_address[1]
        logger.info("[startup] serving service=%s address=%s:%d metrics_port=%d",
                    self.service, self._cfg.host, self.port, self.metrics_port)

    async def set_serving(self, serving: bool) -> None:
        """Health of the whole server and each service (ignored once shutting down)."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ["", *(r.service_name for r in self._registrations)]:
            await self.health.set(name, status)

    async def stop(self, drain: Callable[[float], Awaitable[None]] | None = None) -> None:
        """Stop taking work, drain within the grace period, then stop the server."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        await self.health.enter_graceful_shutdown()
        grace_s = self._cfg.shutdown_grace_s
        if drain is not None:
            try:
                async with asyncio.timeout(grace_s):
                    await drain(grace_s)
            except TimeoutError:
                logger.warning("[shutdown] drain exceeded grace_s=%.1f", grace_s)
        await self.server.stop(grace=min(grace_s, 2.0))
        if self._metrics_httpd is not None:
            # Free the port and the serving thread (a process may start several servers).
            await asyncio.to_thread(self._metrics_httpd.shutdown)  # waits one poll (0.5 s)
            self._metrics_httpd.server_close()
            self._metrics_httpd = None
        logger.info("[shutdown] stopped service=%s", self.service)


def _start_metrics(host: str, port: int) -> Any:
    server, _thread = start_http_server(port, addr=host)
    return server


async def watch_dependency(server: Server, probe: Callable[[], Awaitable[Any]],
                           interval_s: float = HEALTH_PROBE_INTERVAL_S) -> None:
    """Report NOT_SERVING while ``probe`` fails (Redis unreachable), SERVING once it
    answers again; one log line per change, so an outage does not flood the log."""
    healthy = True
    # The probe is the service's Redis PING: its round trip, once a second, is the
    # Redis latency every request of the service sees too (failed probes not timed).
    roundtrip = REDIS_ROUNDTRIP_SECONDS.labels(server.service)
    while True:
        # redis-py's PING can swallow the cancel that stops this loop (libra/cancellation.py).
        raise_if_cancelled()
        try:
            started_s = time.perf_counter()
            # asyncio.timeout, not wait_for: in 3.11 wait_for can swallow a cancel that
            # lands as the probe completes, and this loop would then never end (a SIGTERM
            # right after start-up hung the coordinator's exit, 1 in ~15 tries).
            async with asyncio.timeout(interval_s * 2):
                await probe()
            roundtrip.observe(time.perf_counter() - started_s)
            error = None
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready"
            error = exc
        if (error is None) != healthy:
            healthy = error is None
            await server.set_serving(healthy)
            if healthy:
                logger.info("[health] dependency reachable again: SERVING")
            else:
                logger.warning("[health] dependency unreachable (%s: %s): NOT_SERVING until "
                               "it answers", type(error).__name__, error)
        await asyncio.sleep(interval_s)


async def serve(service: str, cfg: ServerConfig, registrations: Iterable[Registration],
                run: Callable[[], Awaitable[None]] | None = None,
                drain: Callable[[float], Awaitable[None]] | None = None,
                on_started: Callable[[Server], Awaitable[None]] | None = None,
                health_probe: Callable[[], Awaitable[Any]] | None = None,
                auth: AuthConfig | None = None) -> None:
    """Serve until SIGTERM/SIGINT (or until ``run`` returns), then shut down gracefully.

    Args:
        run: the service's long-lived loop (started after the server is up).
        drain: called on shutdown with the grace period in seconds.
        on_started: called once the port is bound (registration with the coordinator).
        health_probe: checks a dependency the service cannot work without (its Redis's
            PING); health is NOT_SERVING while it fails (``watch_dependency``).
        auth: tokens and TLS files (docs/operations.md, "Security"); None: open.
    """
    server = Server(service, cfg, registrations, auth)
    await server.start()
    watcher = (None if health_probe is None
               else asyncio.create_task(watch_dependency(server, health_probe)))
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # The handler only sets state; shutdown runs below on the event loop.
        loop.add_signal_handler(sig, stop_requested.set)
    if on_started is not None:
        await on_started(server)
    loop_task = asyncio.create_task(run()) if run is not None else None
    waiters = [asyncio.create_task(stop_requested.wait())]
    if loop_task is not None:
        waiters.append(loop_task)
    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    if loop_task is not None and loop_task in done and loop_task.exception() is not None:
        logger.error("[shutdown] main loop failed", exc_info=loop_task.exception())
        if watcher is not None:
            await stop_task(watcher)
        await server.stop(drain)
        raise SystemExit(1)
    logger.info("[shutdown] stop requested service=%s", service)
    await server.stop(drain)
    for task in (loop_task, watcher):
        if task is not None:
            await stop_task(task)


MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Clients ping an idle connection this often, so a peer that vanished is noticed.
CLIENT_KEEPALIVE_MS = 30_000


def server_options() -> list[tuple[str, int]]:
    """Server options that accept the clients' keepalive pings.

    gRPC servers by default take a ping on a connection without data as a "strike" when
    it comes sooner than 5 minutes after the last, and after two strikes end the
    connection (GOAWAY "too_many_pings"). A stream that idles for minutes (the tool-return
    stream while the trainer warms up) then broke with UNAVAILABLE "Too many pings". The
    server therefore allows pings at half the clients' interval, also without calls.
    """
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", CLIENT_KEEPALIVE_MS // 2),
    ]


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A plaintext channel without credentials (tests, loopback tools)."""
    return client_channel(address, None)


def client_channel(address: str, auth: ClientAuth | None) -> grpc.aio.Channel:
    """A client channel with the project's options (keepalive, message size, reconnect);
    with ``auth``, the bearer token on every call and TLS when a CA file is given.

    Reconnect backoff is capped at 2 s (gRPC's default grows to 120 s): after a peer is
    restarted, calls fail fast with UNAVAILABLE until the channel's next connection
    attempt, so a long backoff would keep a restarted coordinator unreachable for its
    callers long after it is back.
    """
    return open_channel(address, [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", CLIENT_KEEPALIVE_MS),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.min_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ], auth)
