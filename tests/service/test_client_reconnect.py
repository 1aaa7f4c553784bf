"""A typed client's call right after its peer came back is not refused by the channel's
reconnect backoff (``libra.clients.base``), and a peer still down fails as UNAVAILABLE.

Real: grpc.aio servers on a fixed loopback port (stopped and started again), the health
service, a client channel built as every typed client builds it. Found by the fault
matrix: after a trainer restart the coordinator's next StartJob failed "failed to
connect to all addresses" for up to 2 s although the trainer was serving again.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from libra.clients.base import GrpcClientBase
from libra.errors import Unavailable
from libra_cli.redis_server import free_ports

DOWN_S = 4.0  # long enough for the channel's reconnect backoff to reach its 2 s cap


class HealthClient(GrpcClientBase):
    async def check(self) -> int:
        stub = health_pb2_grpc.HealthStub(self._channel)
        resp = await self._call(stub.Check, health_pb2.HealthCheckRequest())  # not idempotent
        return resp.status


async def start_server(port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def test_a_call_right_after_the_peer_restarted_goes_through() -> None:
    (port,) = free_ports(1)
    server = await start_server(port)
    client = HealthClient(f"127.0.0.1:{port}", timeout_s=10.0)
    try:
        assert await client.check() == health_pb2.HealthCheckResponse.SERVING
        await server.stop(None)
        with pytest.raises(Unavailable):
            await client.check()
        await asyncio.sleep(DOWN_S)  # reconnect attempts fail; backoff grows to its cap
        server = await start_server(port)
        # The channel is most likely between attempts now; the call waits for the next.
        assert await client.check() == health_pb2.HealthCheckResponse.SERVING
    finally:
        await client.close()
        await server.stop(None)


async def test_a_peer_that_stays_down_is_unavailable_within_the_reconnect_wait() -> None:
    (port,) = free_ports(1)
    client = HealthClient(f"127.0.0.1:{port}", timeout_s=30.0)
    started = time.monotonic()
    try:
        with pytest.raises(Unavailable, match="failed to connect"):
            await client.check()
    finally:
        await client.close()
    # Bounded by the one wait for a reconnect, not by the call's 30 s deadline.
    assert time.monotonic() - started < 30.0
