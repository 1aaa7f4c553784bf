"""Fixtures for the coordinator service tests.

``stack``: the agent endpoint's stack (agent_stack.py) for the test files that use it.
``client``: the typed gRPC client on an in-process coordinator server (port 0) over the
requesting module's ``core`` fixture, so each module wires the core it checks (data roots,
model check, ...) and shares the serving and closing. A module whose server needs more
(an interceptor, limits) defines its own ``client``, which overrides this one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from libra.clients.coordinator import GrpcCoordinatorClient
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from tests.service.coordinator.agent_stack import stack  # noqa: F401 - a fixture
from tests.service.grpc_harness import serving


@pytest.fixture
async def client(core: CoordinatorCore) -> AsyncIterator[GrpcCoordinatorClient]:
    async with serving("coordinator",
                       coordinator_pb2_grpc.add_CoordinatorServiceServicer_to_server,
                       CoordinatorServicer(core), coordinator_pb2.DESCRIPTOR,
                       "CoordinatorService") as address:
        c = GrpcCoordinatorClient(address, timeout_s=30.0)
        yield c
        await c.close()
