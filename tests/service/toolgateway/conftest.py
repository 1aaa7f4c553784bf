"""A real tool gateway over gRPC: ``build_core`` (real sandbox, tools, rewards) behind
``ToolGatewayServicer`` on a ``libra.grpcx.Server`` bound to port 0, and the typed client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from libra.clients.toolgateway import GrpcToolGatewayClient
from libra.grpcx import Registration, Server
from libra.proto.toolgateway.v1 import toolgateway_pb2, toolgateway_pb2_grpc
from libra.service_config import ServerConfig
from services.toolgateway.__main__ import build_core
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.servicer import ToolGatewayServicer

SERVICE_NAME = toolgateway_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name


@dataclass
class Gateway:
    server: Server
    client: GrpcToolGatewayClient

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    """Factory: a gateway with ``ToolGatewayConfig`` overrides (no injected busy by
    default); ``servicer`` wraps the core (a test's subclass of the real servicer)."""
    started: list[Gateway] = []

    async def start(servicer: Callable[[Any], ToolGatewayServicer] = ToolGatewayServicer,
                    **overrides: Any) -> Gateway:
        overrides.setdefault("calculator_transient_failure_rate", 0.0)
        core = build_core(ToolGatewayConfig(**overrides))
        registration = Registration(toolgateway_pb2_grpc.add_ToolGatewayServiceServicer_to_server,
                                    servicer(core), SERVICE_NAME)
        server = Server("toolgateway", ServerConfig(port=0, metrics_port=-1,
                                                    shutdown_grace_s=2.0), [registration])
        await server.start()
        gateway = Gateway(server, GrpcToolGatewayClient(f"127.0.0.1:{server.port}",
                                                        timeout_s=10.0))
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        await gateway.client.close()
        await gateway.server.stop()


@pytest.fixture
async def gateway(start_gateway: StartGateway) -> Gateway:
    return await start_gateway()
