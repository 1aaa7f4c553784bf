"""deploy/compose/compose.yaml: valid Compose, and in step with the code it deploys.

Offline: the Compose Specification JSON schema is vendored next to the file
(deploy/compose/compose-spec.schema.json) and checked with ``jsonschema``; no Docker
engine or network is needed. The semantic checks below cover what the schema cannot:
every LIBRA_* variable is a real config option with a readable value, health checks call
the gRPC health service on the port the service binds, peers and Redis point at compose
services, rollout buckets match the demo job's layout and the bare-metal stack; PID 1 is the
image's init (tini), which reaps orphaned processes.
"""

from __future__ import annotations

import copy
import json
import re
import socket
import tomllib
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from libra.config import ENV_PREFIX, load_config, option_names
from libra_cli import healthcheck
from services.coordinator.config import CoordinatorConfig
from services.rollout.config import RolloutConfig
from services.scheduler.config import SchedulerConfig
from services.toolgateway.config import ToolGatewayConfig
from services.trainer.config import TrainerConfig

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
SCHEMA_FILE = COMPOSE_DIR / "compose-spec.schema.json"
DEMO_JOB = ROOT / "deploy" / "configs" / "demo.toml"
STACK_FILE = ROOT / "deploy" / "baremetal" / "stack.toml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
# PID 1 of every container of the image: python as PID 1 never reaps orphans.
INIT_ENTRYPOINT = ["tini", "--"]

CONFIG_CLASSES: dict[str, type] = {
    "coordinator": CoordinatorConfig, "scheduler": SchedulerConfig,
    "trainer": TrainerConfig, "toolgateway": ToolGatewayConfig, "rollout": RolloutConfig,
}
IMAGE = "libra-runtime:dev"
COMMAND = re.compile(r"^python -m services\.(\w+)$")
SHARES_RUN_FOLDER = {"coordinator", "trainer", "rollout"}
# The `observe` profile (tests/unit/deploy/test_observability.py checks their wiring).
OBSERVE_SERVICES = {"prometheus", "grafana", "otel-collector", "jaeger"}


# -- helpers ------------------------------------------------------------------------------

def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _as_list(command: Any) -> list[str]:
    return command.split() if isinstance(command, str) else list(command)


def _kind(svc: dict[str, Any]) -> str | None:
    """The Libra service a compose service runs (``services.<kind>``), or None."""
    match = COMMAND.match(" ".join(_as_list(svc.get("command", []))))
    return match.group(1) if match else None


def _libra_services(doc: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    out = {}
    for name, svc in doc["services"].items():
        kind = _kind(svc)
        if kind is not None:
            out[name] = (kind, svc)
    return out


def image_entrypoint(dockerfile: str) -> list[str] | None:
    """The exec-form ENTRYPOINT of the Dockerfile's last stage (the image deployed)."""
    last_stage = re.split(r"^FROM ", dockerfile, flags=re.M)[-1]
    found = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", last_stage, flags=re.M)
    return json.loads(found[-1]) if found else None


def _env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in env.items()}


def _config(kind: str, svc: dict[str, Any]) -> Any:
    """The config the service would resolve from its environment (no CLI, no file)."""
    return load_config(CONFIG_CLASSES[kind], kind, argv=[], environ=_env(svc))


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _published_host_ports(svc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for port in svc.get("ports", []):
        if isinstance(port, dict):
            out.append((str(port.get("host_ip", "")), str(port["published"])))
            continue
        parts = str(port).rsplit(":", 2)  # the host part may hold ${VAR:-default}
        if len(parts) == 3:
            out.append((parts[0], parts[1]))
        elif len(parts) == 2:
            out.append(("", parts[0]))
    return out


def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _errors(doc: dict[str, Any]) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in _validator().iter_errors(doc))


# -- the schema ----------------------------------------------------------------------------

def test_compose_file_matches_the_compose_spec_schema() -> None:
    assert _errors(_compose()) == []


@pytest.mark.parametrize(("mutate", "where"), [
    (lambda d: d["services"]["trainer"]["depends_on"]["redis"].update(
        condition="service_ready"), "services/trainer/depends_on"),
    (lambda d: d["services"]["coordinator"].update(ports="50051:50051"),
     "services/coordinator/ports"),
    (lambda d: d["services"]["redis"]["healthcheck"].update(retry=3),
     "services/redis/healthcheck"),
    (lambda d: d["services"]["scheduler"].update(restart_policy="always"),
     "services/scheduler"),
])
def test_schema_rejects_broken_files(mutate: Any, where: str) -> None:
    """The vendored schema really is enforced (guards against a vacuous schema)."""
    doc = copy.deepcopy(_compose())
    mutate(doc)
    assert any(err.startswith(where) for err in _errors(doc)), _errors(doc)


# -- what the schema cannot check -----------------------------------------------------------

def test_every_libra_service_is_deployed_from_the_one_image() -> None:
    doc = _compose()
    libra = _libra_services(doc)
    assert {kind for kind, _ in libra.values()} == set(CONFIG_CLASSES)
    others = set(doc["services"]) - set(libra) - OBSERVE_SERVICES
    assert others == {"redis"}, f"{others}: neither Libra services nor Redis"
    for name, (_, svc) in libra.items():
        assert svc["image"] == IMAGE, name
        build = svc["build"]
        assert (COMPOSE_DIR / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["dockerfile"]).is_file(), name
        assert svc.get("restart") in ("always", "unless-stopped", "on-failure"), name


def test_pid_1_of_every_libra_container_is_the_images_init() -> None:
    """tini, the image's ENTRYPOINT, reaps orphaned processes (a tool's leftovers among
    them); no service replaces it (``entrypoint``) or runs docker's init above it
    (``init: true``: tini would be PID 2 and could not reap)."""
    assert image_entrypoint(DOCKERFILE.read_text()) == INIT_ENTRYPOINT
    assert image_entrypoint("FROM a AS b\nENTRYPOINT [\"tini\"]\nFROM c\nCMD [\"x\"]") is None
    for name, (_, svc) in _libra_services(_compose()).items():
        assert "entrypoint" not in svc and not svc.get("init"), name


def test_redis_keeps_an_append_only_file_and_has_a_health_check() -> None:
    redis = _compose()["services"]["redis"]
    assert redis["image"].startswith("redis:7.2")
    command = _as_list(redis["command"])
    assert command[command.index("--appendonly") + 1] == "yes"
    assert _as_list(redis["healthcheck"]["test"])[-2:] == ["redis-cli", "ping"]
    assert any(str(v).endswith(":/data") for v in redis["volumes"])


def test_env_vars_are_real_config_options() -> None:
    for name, (kind, svc) in _libra_services(_compose()).items():
        cls = CONFIG_CLASSES[kind]
        known = {f"{ENV_PREFIX}{kind.upper()}_CONFIG"}
        for option in option_names(cls):
            suffix = option.replace(".", "__").upper()
            known |= {f"{ENV_PREFIX}{kind.upper()}_{suffix}", f"{ENV_PREFIX}{suffix}"}
        for var in _env(svc):
            if var.startswith(ENV_PREFIX):
                assert var in known, f"{name}: {var} is not an option of {cls.__name__}"
        _config(kind, svc)  # every value is readable as its option's type


def test_health_checks_call_grpc_health_on_the_bound_port() -> None:
    for name, (kind, svc) in _libra_services(_compose()).items():
        cfg = _config(kind, svc)
        assert cfg.server.host == "0.0.0.0", f"{name}: must listen on all interfaces"
        assert cfg.server.port > 0, f"{name}: needs a fixed gRPC port"
        test = _as_list(svc["healthcheck"]["test"])
        assert test[:1] in (["CMD"], ["CMD-SHELL"]), name
        assert test[1:] == ["python", "-m", "libra_cli.healthcheck",
                            f"127.0.0.1:{cfg.server.port}"], name


def test_depends_on_targets_exist_and_are_healthy_first() -> None:
    services = _compose()["services"]
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        if isinstance(deps, list):
            pytest.fail(f"{name}: depends_on must use condition: service_healthy")
        for target, spec in deps.items():
            assert target in services, f"{name} depends on unknown service {target}"
            assert target != name
            assert spec.get("condition") == "service_healthy", f"{name} -> {target}"
            assert "healthcheck" in services[target], f"{target} has no health check"


def test_peers_and_redis_point_at_compose_services() -> None:
    doc = _compose()
    libra = _libra_services(doc)
    grpc_port = {name: _config(kind, svc).server.port for name, (kind, svc) in libra.items()}
    kind_of = {name: kind for name, (kind, _) in libra.items()}
    for name, (kind, svc) in libra.items():
        cfg = _config(kind, svc)
        if hasattr(cfg, "redis_url"):
            assert re.fullmatch(r"redis://:\$\{LIBRA_REDIS_PASSWORD:\?[^}]+\}@redis:6379/\d+",
                                cfg.redis_url), f"{name}: Redis URL without the password"
            assert "redis" in svc.get("depends_on", {}), f"{name} must wait for Redis"
        # The peers a service dials are the ones its entry point reads.
        main = (ROOT / "services" / kind / "__main__.py").read_text()
        for peer in sorted(set(re.findall(r"peers\.(coordinator|scheduler|trainer|"
                                          r"toolgateway)\b", main))):
            host, port = _host_port(getattr(cfg.peers, peer))
            assert host in libra, f"{name}: peers.{peer}={host} is not a compose service"
            assert kind_of[host] == peer, f"{name}: peers.{peer} points at a {kind_of[host]}"
            assert port == grpc_port[host], f"{name}: peers.{peer} port {port}"


def test_ports_are_unique() -> None:
    libra = _libra_services(_compose())
    grpc_ports = [_config(kind, svc).server.port for kind, svc in libra.values()]
    assert len(grpc_ports) == len(set(grpc_ports)), grpc_ports
    published = [p for svc in _compose()["services"].values()
                 for p in _published_host_ports(svc)]
    assert len({port for _, port in published}) == len(published), published


def test_run_folder_is_one_shared_volume_at_the_run_root() -> None:
    doc = _compose()
    libra = _libra_services(doc)
    coordinator = next(svc for kind, svc in libra.values() if kind == "coordinator")
    run_root = _config("coordinator", coordinator).run_root
    assert run_root.startswith("/"), "run_root must be absolute inside the containers"
    volume_names = set()
    for name, (kind, svc) in libra.items():
        if kind not in SHARES_RUN_FOLDER:
            continue
        mounts = [str(v).split(":") for v in svc.get("volumes", [])]
        at_root = [m[0] for m in mounts if len(m) >= 2 and m[1] == run_root]
        assert at_root, f"{name}: no volume mounted at {run_root}"
        volume_names.update(at_root)
    assert len(volume_names) == 1, volume_names
    assert volume_names <= set(doc.get("volumes", {})), "the run volume must be named"


def test_rollout_instances_match_the_demo_layout_and_the_bare_metal_stack() -> None:
    layout = tomllib.loads(DEMO_JOB.read_text())["layout"]["buckets"]
    buckets = {b["name"]: b for b in layout}
    stack = {r["instance_id"]: r for r in tomllib.loads(STACK_FILE.read_text())["rollout"]}
    rollouts = [_config(kind, svc) for kind, svc in _libra_services(_compose()).values()
                if kind == "rollout"]
    assert {r.bucket for r in rollouts} == set(buckets), "every bucket needs an instance"
    assert len({r.instance_id for r in rollouts}) == len(rollouts), "instance ids unique"
    for r in rollouts:
        bucket = buckets[r.bucket]
        assert r.max_batch_size == bucket["max_batch_size"], r.instance_id
        assert r.max_trajectories == bucket["max_trajectories_per_instance"], r.instance_id
        bare = stack[r.instance_id]
        assert (bare["bucket"], bare["max_batch_size"], bare["max_trajectories"]) == (
            r.bucket, r.max_batch_size, r.max_trajectories), r.instance_id
    assert {r.instance_id for r in rollouts} == set(stack)


# -- libra_cli.healthcheck ----------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(120)  # the refusal answers at once; waiting out the deadline fails
def test_healthcheck_fails_fast_for_an_unreachable_address(
        capsys: pytest.CaptureFixture[str]) -> None:
    # A deadline far beyond the test's timeout: only a refused connection answered at
    # once passes (no wall-clock bound that a loaded machine could break).
    code = healthcheck.main([f"127.0.0.1:{_free_port()}", "--timeout", "600"])
    assert code == 1 and capsys.readouterr().out == "UNREACHABLE\n"


def test_healthcheck_follows_the_serving_status() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        address = f"127.0.0.1:{port}"
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert healthcheck.main([address, "--timeout", "2"]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert healthcheck.main([address, "--timeout", "2"]) == 1
    finally:
        server.stop(grace=None)


# -- security -----------------------------------------------------------------------------

REQUIRED = re.compile(r"^\$\{(LIBRA_[A-Z_]+):\?[^}]+\}$")  # ${VAR:?message}: must be set


def test_every_service_requires_the_service_token_and_redis_a_password() -> None:
    doc = _compose()
    for name, (kind, svc) in _libra_services(doc).items():
        cfg = _config(kind, svc)
        # Compose interpolates the value; unset, `docker compose up` stops with the message.
        match = REQUIRED.match(cfg.auth.service_token)
        assert match and match.group(1) == "LIBRA_SERVICE_TOKEN", name
        if kind == "coordinator":
            match = REQUIRED.match(cfg.auth.api_token)
            assert match and match.group(1) == "LIBRA_API_TOKEN", name
        else:
            assert cfg.auth.api_token == "", f"{name}: has no public methods"
    redis = doc["services"]["redis"]
    command = _as_list(redis["command"])
    assert REQUIRED.match(command[command.index("--requirepass") + 1])
    assert REQUIRED.match(redis["environment"]["REDISCLI_AUTH"])  # health check logs in


def test_only_the_public_api_is_published_and_on_loopback_by_default() -> None:
    doc = _compose()
    published = {}
    for name, svc in doc["services"].items():
        for host_ip, port in _published_host_ports(svc):
            published[(name, port)] = host_ip
    libra = _libra_services(doc)
    coordinator = _config("coordinator", libra["coordinator"][1])
    public = {str(coordinator.server.port), str(coordinator.http_port)}
    for (name, port), host_ip in published.items():
        assert host_ip in ("127.0.0.1", "${LIBRA_PUBLISH_HOST:-127.0.0.1}"), (name, port)
        if host_ip != "127.0.0.1":  # may be widened: only the public API
            assert (name, port in public) == ("coordinator", True), (name, port)
    assert {p for (n, p) in published if n == "coordinator"} >= public
