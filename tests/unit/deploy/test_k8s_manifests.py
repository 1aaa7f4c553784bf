"""deploy/k8s/: in step with the code it deploys.

``problems()`` (k8s_checks.py) checks what a schema cannot (test_k8s_schema.py validates
the objects): every LIBRA_* variable is an option of the service's config and loads;
container ports, Service ports, probes and Prometheus annotations agree with the ports the
service binds; peers and Redis point at Services that select the right pods; tokens come
from the Secret; trainer ranks meet at the trainer's rendezvous port; rollout buckets, caps
and GPUs follow the demo job and the TP degree; the tool gateway is locked down; PID 1 is
the image's init (tini), which reaps orphans. Broken copies must produce a problem, so the
checks are known to bite.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.k8s_checks import (
    DOCKERFILE,
    OVERLAYS,
    container_env,
    libra_containers,
    problems,
    render_overlay,
    workloads,
)
from tests.unit.deploy.test_compose_schema import CONFIG_CLASSES


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_manifests_agree_with_the_code(overlay: str) -> None:
    docs = render_overlay(overlay)
    assert {kind for kind, _, _ in libra_containers(docs)} == {*CONFIG_CLASSES, "rank"}
    assert problems(docs) == []


def test_overlays_set_what_they_promise() -> None:
    cpu, gpu = render_overlay("cpu-demo"), render_overlay("gpu")
    assert all(d["metadata"].get("namespace") == "libra" for d in cpu if d["kind"] != "Namespace")
    named = {d["metadata"]["name"]: d for d in gpu if d["kind"] in ("Deployment", "StatefulSet")}
    long_env = container_env(named["rollout-long"]["spec"]["template"]["spec"]["containers"][0])
    assert long_env["LIBRA_ROLLOUT_VLLM_TENSOR_PARALLEL_SIZE"] == "2"
    assert long_env["LIBRA_ROLLOUT_BUCKET"] == "long"  # the patch merged into the base env
    assert named["trainer-rank"]["spec"]["replicas"] == 3
    assert all(c["image"] == "libra-runtime:gpu" for _, _, c in libra_containers(gpu))
    cpu_named = {d["metadata"]["name"]: d for d in workloads(cpu)}
    assert cpu_named["trainer-rank"]["spec"]["replicas"] == 1


def _set_env(workload: str, name: str, value: str) -> Any:
    """A mutation: set (or add) one variable of a workload's first container."""
    def mutate(docs: list[dict[str, Any]]) -> None:
        doc = next(d for d in workloads(docs) if d["metadata"]["name"] == workload)
        env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
        env[:] = [v for v in env if v["name"] != name] + [{"name": name, "value": value}]
    return mutate


@pytest.mark.parametrize(("mutate", "expected"), [
    (_set_env("coordinator", "LIBRA_COORDINATOR_SERVER__PORT", "50059"),
     "container port grpc 50051 != server.port 50059"),
    (_set_env("rollout-short", "LIBRA_ROLLOUT_PEERS__SCHEDULER", "scheduler:50053"),
     "peers.scheduler=scheduler:50053 reaches no container port"),
    (_set_env("trainer", "LIBRA_TRAINER_NUM_RANKS", "5"), "num_ranks 5 but 3 trainer-rank pods"),
    (_set_env("trainer-rank", "LIBRA_TRAINER_RANK_RENDEZVOUS", "trainer:29501"),
     "rendezvous trainer:29501 != the trainer's trainer:29500"),
    (_set_env("rollout-long", "LIBRA_ROLLOUT_VLLM_TENSOR_PARALLEL_SIZE", "4"),
     "2 GPU(s) for engine vllm with TP 4"),
    (_set_env("scheduler", "LIBRA_SCHEDULER_TICK_MS", "5"), "not an option of SchedulerConfig"),
    (_set_env("scheduler", "LIBRA_SCHEDULER_SERVER__METRICS_PORT", "9200"),
     "container port metrics 9100 != server.metrics_port 9200"),
])
def test_cross_check_catches_a_manifest_that_disagrees(mutate: Any, expected: str) -> None:
    docs = render_overlay("gpu")
    mutate(docs)
    found = problems(docs)
    assert any(expected in p for p in found), found


def test_cross_check_catches_a_probe_on_the_wrong_port() -> None:
    docs = render_overlay("cpu-demo")
    trainer = next(d for d in workloads(docs) if d["metadata"]["name"] == "trainer")
    trainer["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["grpc"]["port"] = 50051
    assert any("livenessProbe must be gRPC health on 50053" in p for p in problems(docs))


def test_cross_check_catches_a_loose_tool_gateway() -> None:
    docs = render_overlay("cpu-demo")
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    policy["spec"]["egress"] = [{}]  # allow everything out
    gateway = next(d for d in workloads(docs) if d["metadata"]["name"] == "toolgateway")
    gateway["spec"]["template"]["spec"]["containers"][0]["securityContext"][
        "readOnlyRootFilesystem"] = False
    found = problems(docs)
    assert "toolgateway: no NetworkPolicy denying all egress" in found
    assert any("securityContext not restricted" in p for p in found), found


def test_cross_check_catches_a_tool_gateway_without_a_reaper() -> None:
    """The gateway's PID 1 must reap its tools' killed leftovers: a ``command`` replaces
    the image's tini with python, and an image without the entrypoint has none."""
    docs = render_overlay("cpu-demo")
    gateway = next(d for d in workloads(docs) if d["metadata"]["name"] == "toolgateway")
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    container["command"] = container.pop("args")
    assert any(p.startswith("toolgateway/toolgateway: command replaces the image's init")
               for p in problems(docs))
    without_init = DOCKERFILE.read_text().replace('ENTRYPOINT ["tini", "--"]\n', "")
    assert any(p.startswith("image: ENTRYPOINT is not")
               for p in problems(render_overlay("cpu-demo"), dockerfile=without_init))
