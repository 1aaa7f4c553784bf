"""Start one servicer on a real grpc.aio server on a free loopback port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from libra.grpcx import Registration, Server
from libra.service_config import ServerConfig


@asynccontextmanager
async def serving(service: str, add_fn: Any, servicer: Any, descriptor: Any,
                  name: str, port: int = 0) -> AsyncIterator[str]:
    """Yields the server's address (a free port unless ``port``); stops it
    (gracefully) on exit."""
    full_name = descriptor.services_by_name[name].full_name
    server = Server(service, ServerConfig(port=port, metrics_port=-1, shutdown_grace_s=1.0),
                    [Registration(add_fn, servicer, full_name)])
    await server.start()
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        await server.stop()
