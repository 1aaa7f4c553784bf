"""gRPC side of authentication and TLS: the server interceptor, server credentials, and
the client channel that sends the bearer token (and verifies the server's certificate).

The access rules themselves live in ``libra.access`` (one table, shared with REST).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import Counter

from libra.access import Access, Tokens, TokenStore, bearer, method_access
from libra.errors import PermissionDenied
from libra.service_config import AuthConfig

logger = logging.getLogger(__name__)

AUTH_REFUSED_TOTAL = Counter("libra_rpc_auth_refused_total",
                             "calls refused by the auth interceptor", ["method", "code"])
LOG_EVERY_S = 60.0


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks ``authorization: Bearer <token>`` against the method's access class.

    No valid token -> UNAUTHENTICATED; the api token on an internal method ->
    PERMISSION_DENIED. The refusal happens before the handler runs (and before the
    request is read), so an unauthenticated caller reaches no service code. With a
    :class:`TokenStore` the accepted tokens follow the token files (rotation).
    """

    def __init__(self, tokens: Tokens | TokenStore) -> None:
        self._tokens = tokens
        self._logged_at_s: dict[tuple[str, str], float] = {}

    async def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001
        """Refuse the call unless its bearer token may call the method (see the class)."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        needed = method_access(handler_call_details.method)
        presented = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                presented = bearer(value if isinstance(value, str) else value.decode())
        refusal = self._tokens.current().allows(presented, needed)
        if refusal is None:
            return handler
        if refusal is Access.OPEN:
            code = grpc.StatusCode.UNAUTHENTICATED
            text = "missing or invalid bearer token (metadata authorization: Bearer <token>)"
        else:
            code = grpc.StatusCode.PERMISSION_DENIED
            text = (f"{PermissionDenied.MESSAGE_PREFIX}{handler_call_details.method} is "
                    "internal; the api token may call the job API only")
        self._note_refusal(handler_call_details.method, code.name)
        return _refusing_handler(handler, code, text)

    def _note_refusal(self, method: str, code: str) -> None:
        """Count every refusal; log each (method, code) at most once a minute, so a
        caller hammering the port cannot flood the log."""
        AUTH_REFUSED_TOTAL.labels(method.rsplit("/", 1)[-1], code).inc()
        now_s = time.monotonic()
        if now_s - self._logged_at_s.get((method, code), -LOG_EVERY_S) >= LOG_EVERY_S:
            self._logged_at_s[(method, code)] = now_s
            logger.warning("[auth] refused method=%s code=%s (logged once a minute; "
                           "libra_rpc_auth_refused_total counts all)", method, code)


def _refusing_handler(handler: Any, code: grpc.StatusCode, text: str) -> Any:
    """A handler of the same streaming shape as ``handler`` that aborts at once."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(code, text)

    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(abort, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(abort, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(abort, **kwargs)
    return grpc.stream_stream_rpc_method_handler(abort, **kwargs)


def server_credentials(cfg: AuthConfig) -> grpc.ServerCredentials | None:
    """TLS credentials from ``tls_cert_file``/``tls_key_file`` (None: plaintext); with
    ``tls_client_ca_file`` every caller must present a certificate signed by that CA."""
    if not cfg.tls_cert_file and not cfg.tls_key_file:
        if cfg.tls_client_ca_file:
            raise ValueError("config auth.tls_client_ca_file needs auth.tls_cert_file and "
                             "auth.tls_key_file (mutual TLS is TLS first)")
        return None
    if not (cfg.tls_cert_file and cfg.tls_key_file):
        raise ValueError("config auth.tls_cert_file and auth.tls_key_file go together; "
                         "set both or neither")
    pair = (Path(cfg.tls_key_file).read_bytes(), Path(cfg.tls_cert_file).read_bytes())
    if not cfg.tls_client_ca_file:
        return grpc.ssl_server_credentials([pair])
    return grpc.ssl_server_credentials(
        [pair], root_certificates=Path(cfg.tls_client_ca_file).read_bytes(),
        require_client_auth=True)


@dataclass(frozen=True)
class ClientAuth:
    """What a client sends: a bearer token, and the CA that verifies the server (TLS)."""

    token: str = ""
    tls_ca_file: str = ""
    tls_client_cert_file: str = ""  # with the key: mutual TLS
    tls_client_key_file: str = ""
    token_source: Callable[[], str] | None = field(default=None, compare=False)
    """Gives the token per call instead of ``token`` (a token file that may change)."""

    @classmethod
    def for_service(cls, cfg: AuthConfig) -> ClientAuth:
        """A service calling its peers: the service token (the first line of its file,
        followed when the file changes), the CA, its client cert."""
        store = TokenStore(cfg)
        source = (lambda: store.current().service) if cfg.service_token_file else None
        return cls(token=store.current().service, tls_ca_file=cfg.tls_ca_file,
                   tls_client_cert_file=cfg.tls_client_cert_file,
                   tls_client_key_file=cfg.tls_client_key_file, token_source=source)

    def current_token(self) -> str:
        """The token to send now (a rotated file's first token once it changed)."""
        return self.token_source() if self.token_source is not None else self.token

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials: the CA, and the client certificate when one is set."""
        if bool(self.tls_client_cert_file) != bool(self.tls_client_key_file):
            raise ValueError("config auth.tls_client_cert_file and auth.tls_client_key_file "
                             "go together; set both or neither")
        key = Path(self.tls_client_key_file).read_bytes() if self.tls_client_key_file else None
        cert = (Path(self.tls_client_cert_file).read_bytes() if self.tls_client_cert_file
                else None)
        return grpc.ssl_channel_credentials(Path(self.tls_ca_file).read_bytes(), key, cert)


class _Token:
    """Adds ``authorization: Bearer <token>`` to a call's metadata (the token asked for
    per call, so a rotated token file takes effect without a new channel)."""

    def __init__(self, token: Callable[[], str]) -> None:
        self._token = token

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        header = ("authorization", f"Bearer {self._token()}")
        metadata = grpc.aio.Metadata(*(details.metadata or ()), header)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata,
                                          details.credentials, details.wait_for_ready)


# One class per call shape: grpc.aio files each interceptor under the FIRST shape it is an
# instance of, so a single class deriving from all four would never see stream calls.
class _UnaryUnary(_Token, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001
        return await continuation(self._details(details), request)


class _UnaryStream(_Token, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # noqa: ANN001
        return await continuation(self._details(details), request)


class _StreamUnary(_Token, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, requests):  # noqa: ANN001
        return await continuation(self._details(details), requests)


class _StreamStream(_Token, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, requests):  # noqa: ANN001
        return await continuation(self._details(details), requests)


def _token_interceptors(token: Callable[[], str]) -> list[Any]:
    return [shape(token) for shape in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


def open_channel(address: str, options: list[tuple[str, Any]],
                 auth: ClientAuth | None) -> grpc.aio.Channel:
    """A channel to ``address``: TLS when ``auth.tls_ca_file`` is set, the token on
    every call when ``auth.token`` is set, plaintext without either."""
    interceptors = (_token_interceptors(auth.current_token) if auth and auth.current_token()
                    else None)
    if auth and auth.tls_ca_file:
        return grpc.aio.secure_channel(address, auth.channel_credentials(), options=options,
                                       interceptors=interceptors)
    return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
