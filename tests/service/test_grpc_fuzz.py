"""Fuzz every gRPC method of every service: no handler answers UNKNOWN or INTERNAL.

Real: each service's servicer over its real core (coordinator, scheduler, trainer, rollout
stores on the session's redis-server; the tool gateway's real sandbox, tools and rewards)
behind ``libra.grpcx.Server`` on a loopback socket with auth on (the service token is
sent), and requests built by hypothesis from the message descriptors: random field
values including 1 MiB strings, control characters, lone surrogates' replacement,
negative and 64-bit-extreme integers, nan/inf floats, unknown enum values and JSON-ish
text for ``*_json`` fields. Undecodable bytes go through raw channel calls (identity
serializers). Not real: the trainer's torch backend, the rollout's engine and the
coordinator's runner are the project's fakes (tests/fakes), since what is under test is
how each handler treats its input.

Each call must end OK or with a named status (INVALID_ARGUMENT, NOT_FOUND, ...): UNKNOWN
or INTERNAL means a handler let an exception escape unmapped. Hypothesis runs with a fixed
seed (derandomize) and a bounded number of examples per method.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from google.protobuf import descriptor as d
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libra import redis_keys as keys
from libra.clock import FakeClock, SystemClock
from libra.grpcx import Registration, Server
from libra.jobspec import JobSpec
from libra.proto.coordinator.v1 import coordinator_pb2, coordinator_pb2_grpc
from libra.proto.rollout.v1 import rollout_pb2, rollout_pb2_grpc
from libra.proto.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from libra.proto.toolgateway.v1 import toolgateway_pb2, toolgateway_pb2_grpc
from libra.proto.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from libra.service_config import AuthConfig, ServerConfig
from libra_cli.redis_server import EmbeddedRedis
from services.coordinator.core import CoordinatorCore
from services.coordinator.servicer import CoordinatorServicer
from services.coordinator.store import RedisCoordinatorStore
from services.rollout.core import RolloutCore, RolloutSettings
from services.rollout.servicer import RolloutServicer
from services.rollout.store import RedisRolloutStore
from services.scheduler.core import SchedulerCore
from services.scheduler.servicer import SchedulerServicer
from services.scheduler.store import RedisSchedulerStore
from services.toolgateway.__main__ import build_core
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.servicer import ToolGatewayServicer
from services.trainer.core import TrainerCore
from services.trainer.servicer import GradientChannelServicer, TrainerServicer
from services.trainer.store import RedisTrainerStore
from services.trainer.weight_server import WeightServer
from services.trainer.weight_servicer import WeightServicer
from tests.fakes.coordinator import FakeCoordinator
from tests.fakes.engine import FakeEngine, FakeEngineLoader, make_tokenizer
from tests.fakes.runner import FakeRunner
from tests.fakes.scheduler import FakeScheduler
from tests.fakes.toolgateway import FakeToolGateway
from tests.fakes.trainer_backend import FakeBackendFactory

SERVICE_TOKEN = "fuzz-service-token"
AUTH = AuthConfig(api_token="fuzz-api-token", service_token=SERVICE_TOKEN)
METADATA = (("authorization", f"Bearer {SERVICE_TOKEN}"),)
EXAMPLES_PER_METHOD = 30
CALL_DEADLINE_S = 30.0  # generous: a loaded 2-core machine must not turn a code into a timeout
# A call that ends like this let an exception escape its handler unmapped.
UNNAMED = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
HUGE_TEXT_CHARS = 1 << 20
INT_EDGES = {
    d.FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    d.FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    d.FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    d.FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    d.FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
    d.FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    d.FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    d.FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    d.FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    d.FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
}
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                 max_size=4),
    max_leaves=12)


# -- strategies from descriptors ---------------------------------------------------------

# Ids that exist in the seeded stores (the coordinator's job id is added at start), so
# generated requests reach past the not-found checks.
KNOWN_IDS = ["", "j1", "rollout-0", "calculator", "short", " ", "a\nb", "\x00", "é" * 300,
             "../../etc/passwd"]


def _text(field_name: str) -> st.SearchStrategy[str]:
    ids = st.sampled_from(KNOWN_IDS)
    plain = st.text(max_size=64)
    huge = st.just("x" * HUGE_TEXT_CHARS)
    options = [ids, plain, huge]
    if field_name.endswith("_json") or field_name == "spec":
        options.append(_JSON.map(lambda v: json.dumps(v, allow_nan=True)))
        options.append(st.dictionaries(st.text(max_size=12), _JSON, max_size=4).map(json.dumps))
    return st.one_of(*options)


def _scalar(field: d.FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type == d.FieldDescriptor.TYPE_STRING:
        return _text(field.name)
    if field.type == d.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64) | st.just(b"\xff" * 4096)
    if field.type == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type in (d.FieldDescriptor.TYPE_DOUBLE, d.FieldDescriptor.TYPE_FLOAT):
        width = 32 if field.type == d.FieldDescriptor.TYPE_FLOAT else 64
        return st.floats(width=width, allow_nan=True, allow_infinity=True)
    if field.type == d.FieldDescriptor.TYPE_ENUM:  # open enums: unknown values decode too
        return st.integers(-2, 12)
    low, high = INT_EDGES[field.type]
    return st.one_of(st.sampled_from([low, high, -1, 0, 1, 2]), st.integers(low, high))


@st.composite
def message(draw: st.DrawFn, desc: d.Descriptor, depth: int = 0) -> Any:
    msg = GetMessageClass(desc)()
    for field in desc.fields:
        if not draw(st.booleans()):
            continue  # proto3: absent and default look the same; leave it out half the time
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, value_f = (field.message_type.fields_by_name[n] for n in ("key", "value"))
            if value_f.message_type is None:
                entries = draw(st.dictionaries(_scalar(key_f), _scalar(value_f), max_size=3))
                getattr(msg, field.name).update(entries)
            continue
        if field.message_type is not None:
            if depth >= 2:
                continue
            count = draw(st.integers(0, 3)) if _repeated(field) else 1
            values = [draw(message(field.message_type, depth + 1)) for _ in range(count)]
            if _repeated(field):
                getattr(msg, field.name).extend(values)
            else:
                getattr(msg, field.name).CopyFrom(values[0])
        elif _repeated(field):
            getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=4)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg


def _repeated(field: d.FieldDescriptor) -> bool:
    return field.is_repeated


# -- the services --------------------------------------------------------------------------

@dataclass
class Method:
    path: str
    desc: d.MethodDescriptor
    address: str

    @property
    def streaming(self) -> bool:
        return self.desc.client_streaming or self.desc.server_streaming


SERVICES = [(coordinator_pb2, "CoordinatorService"), (scheduler_pb2, "SchedulerService"),
            (trainer_pb2, "TrainerService"), (trainer_pb2, "GradientChannel"),
            (trainer_pb2, "WeightService"),
            (toolgateway_pb2, "ToolGatewayService"), (rollout_pb2, "RolloutService")]


async def _seed(r: aioredis.Redis, run_dir: Path) -> None:
    """A job j1 running and rollout-0 holding a lease, so ids the strategies favour
    reach past the not-found checks."""
    await r.flushdb()
    await r.hset(keys.job("j1"), mapping={"spec_json": JobSpec().to_json(), "state": "running",
                                          "run_dir": str(run_dir)})
    await r.sadd(keys.WORKERS, "rollout-0")
    await r.hset(keys.lease("rollout-0"), mapping={"role": "core-rollout", "bucket": "short",
                                                   "epoch": 7})


def _servicers(r_text: aioredis.Redis, r_bytes: aioredis.Redis, tmp_path: Path,
               ) -> tuple[CoordinatorCore, list[tuple[Any, Any, str, Any]]]:
    trainer = TrainerCore(RedisTrainerStore(r_bytes), FakeBackendFactory(), FakeCoordinator(),
                          FakeClock(), block_ms=20)
    rollout = RolloutCore(RolloutSettings(instance_id="rollout-0", bucket="short"),
                          RedisRolloutStore(r_bytes),
                          FakeEngineLoader(FakeEngine(make_tokenizer())), FakeToolGateway(),
                          FakeScheduler(), FakeCoordinator(), FakeClock())
    coordinator = CoordinatorCore(RedisCoordinatorStore(r_text, SystemClock()), FakeRunner(),
                                  FakeRunner(), SystemClock(), tmp_path / "runs")
    gateway = build_core(ToolGatewayConfig(calculator_transient_failure_rate=0.0))
    return coordinator, [
        (coordinator_pb2_grpc, "CoordinatorService", "coordinator",
         CoordinatorServicer(coordinator)),
        (scheduler_pb2_grpc, "SchedulerService", "scheduler",
         SchedulerServicer(SchedulerCore(RedisSchedulerStore(r_bytes), FakeClock()))),
        (trainer_pb2_grpc, "TrainerService", "trainer", TrainerServicer(trainer)),
        (trainer_pb2_grpc, "GradientChannel", "trainer", GradientChannelServicer(trainer)),
        (trainer_pb2_grpc, "WeightService", "trainer", WeightServicer(
            WeightServer(RedisTrainerStore(r_bytes).job_run_dir, max_streams=4))),
        (toolgateway_pb2_grpc, "ToolGatewayService", "toolgateway",
         ToolGatewayServicer(gateway)),
        (rollout_pb2_grpc, "RolloutService", "rollout", RolloutServicer(rollout)),
    ]


VALID_SPEC = 'name = "fuzz"\n[algorithm]\nnum_steps = 3\n'


@pytest.fixture
async def methods(redis_server: EmbeddedRedis, tmp_path: Path) -> AsyncIterator[list[Method]]:
    # The coordinator keeps its own database: the seed below is the other services' view.
    r_text = aioredis.from_url(redis_server.url.removesuffix("/0") + "/1",
                               decode_responses=True)
    await r_text.flushdb()
    r_bytes = aioredis.from_url(redis_server.url, decode_responses=False)
    await _seed(r_bytes, tmp_path)
    servers: list[Server] = []
    found: list[Method] = []
    coordinator, servicers = _servicers(r_text, r_bytes, tmp_path)
    job = await coordinator.create_job(VALID_SPEC, "toml")
    KNOWN_IDS.append(job.job_id)
    try:
        for (pb2_grpc, name, process, servicer), (pb2, _) in zip(servicers, SERVICES,
                                                                  strict=True):
            desc = pb2.DESCRIPTOR.services_by_name[name]
            add = getattr(pb2_grpc, f"add_{name}Servicer_to_server")
            server = Server(process, ServerConfig(port=0, metrics_port=-1,
                                                  shutdown_grace_s=1.0),
                            [Registration(add, servicer, desc.full_name)], AUTH)
            await server.start()
            servers.append(server)
            found += [Method(f"/{desc.full_name}/{m.name}", m, f"127.0.0.1:{server.port}")
                      for m in desc.methods]
        yield found
    finally:
        KNOWN_IDS.remove(job.job_id)
        for server in servers:
            await server.stop()
        await r_text.aclose()
        await r_bytes.aclose()


# -- calls (a blocking channel, from a worker thread: the servers run on the test's loop) --

def _call(channel: grpc.Channel, method: Method, payload: bytes) -> grpc.StatusCode:
    ident = (lambda b: b)  # noqa: E731 - identity serializers: the bytes go out as given
    try:
        if method.streaming:
            stub = channel.stream_stream(method.path, request_serializer=ident,
                                         response_deserializer=ident)
            for _ in stub(iter([payload]), timeout=CALL_DEADLINE_S, metadata=METADATA):
                pass
        else:
            stub = channel.unary_unary(method.path, request_serializer=ident,
                                       response_deserializer=ident)
            stub(payload, timeout=CALL_DEADLINE_S, metadata=METADATA)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@dataclass
class Tally:
    cases: int = 0
    failures: list[str] | None = None

    def record(self, method: Method, what: str, code: grpc.StatusCode) -> None:
        self.cases += 1
        if code in UNNAMED:
            assert self.failures is not None
            self.failures.append(f"{method.path} {code.name} for {what}")


@pytest.fixture
def channel() -> Iterator[dict[str, grpc.Channel]]:
    opened: dict[str, grpc.Channel] = {}
    yield opened
    for ch in opened.values():
        ch.close()


def _fuzz_method(method: Method, channel: grpc.Channel, tally: Tally) -> None:
    @settings(max_examples=EXAMPLES_PER_METHOD, derandomize=True, deadline=None,
              database=None, suppress_health_check=list(HealthCheck))
    @given(msg=message(method.desc.input_type))
    def run(msg: Any) -> None:
        payload = msg.SerializeToString()
        tally.record(method, f"{str(msg)[:300]!r}", _call(channel, method, payload))

    run()


UNDECODABLE = [b"\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x08" + b"\xff" * 11,
               b"\x12\x05abc"]  # bad tag, overlong length, overlong varint, truncated


async def test_no_handler_answers_unknown_or_internal(
        methods: list[Method], channel: dict[str, grpc.Channel]) -> None:
    tally = Tally(failures=[])

    def fuzz_all() -> None:
        for method in methods:
            ch = channel.setdefault(method.address, grpc.insecure_channel(method.address))
            for raw in UNDECODABLE:
                tally.record(method, f"bytes {raw!r}", _call(ch, method, raw))
            _fuzz_method(method, ch, tally)

    await asyncio.to_thread(fuzz_all)
    print(f"\n[grpc-fuzz] methods={len(methods)} cases={tally.cases} "
          f"unnamed={len(tally.failures or [])}")
    assert len(methods) == 34  # RenewLeases is the 34th
    first: dict[str, str] = {}
    for failure in tally.failures or []:
        first.setdefault(" ".join(failure.split(" ", 2)[:2]), failure)
    assert not first, "\n".join(first.values())
