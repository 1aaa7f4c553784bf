"""Fixtures of the trainer's service tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from libra.clients.weights import GrpcWeightClient
from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer.weight_servicer import WeightServicer
from tests.service.grpc_harness import serving
from tests.service.trainer.weight_rig import Trainer


@pytest.fixture
async def serve(tmp_path: Path):  # noqa: ANN201
    """``await serve(**kwargs)`` -> (Trainer, client) served until the test ends."""
    stack: list = []

    async def start(**kwargs) -> tuple[Trainer, GrpcWeightClient]:  # noqa: ANN003
        trainer = Trainer(tmp_path, **kwargs)
        ctx = serving("trainer", trainer_pb2_grpc.add_WeightServiceServicer_to_server,
                      WeightServicer(trainer.server), trainer_pb2.DESCRIPTOR, "WeightService")
        trainer.address = await ctx.__aenter__()
        client = GrpcWeightClient(trainer.address, 5.0)
        stack.append((ctx, client))
        return trainer, client

    yield start
    for ctx, client in stack:
        await client.close()
        await ctx.__aexit__(None, None, None)
