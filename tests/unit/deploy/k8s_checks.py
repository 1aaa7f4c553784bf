"""The cross-check of deploy/k8s/ against the code it deploys, for test_k8s_manifests.py
(and ``render_overlay`` for test_k8s_schema.py).

The overlays are rendered offline (``kustomize_lite``: no kustomize or kubectl here).
``problems()`` checks what a schema cannot, the way test_compose_schema.py does for
compose: every LIBRA_* variable is an option of the service's config and loads; container
ports, Service ports, probes and Prometheus annotations agree with the ports the service
binds; peers and Redis point at Services that select the right pods; tokens come from the
Secret; trainer ranks meet at the trainer's rendezvous port; rollout buckets, caps and GPUs
follow the demo job and the TP degree; the tool gateway is locked down; PID 1 of every
Libra container is the image's init (tini), which reaps orphaned processes.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from libra.config import ENV_PREFIX, load_config, option_names
from libra.grpcx import LIVENESS_SERVICE
from services.trainer.rank import RankConfig
from tests.unit.deploy.kustomize_lite import render
from tests.unit.deploy.test_compose_schema import (
    CONFIG_CLASSES,
    DOCKERFILE,
    INIT_ENTRYPOINT,
    image_entrypoint,
)

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ["cpu-demo", "gpu"]
DEMO_JOB = ROOT / "deploy" / "configs" / "demo.toml"
SECRET = "libra-secrets"
GPU = "nvidia.com/gpu"
COMMAND = re.compile(r"^python -m services\.(\w+)(\.rank)?$")
REDIS_URL = re.compile(r"^redis://:\$\(REDIS_PASSWORD\)@redis:6379/\d+$")
# What Kubernetes would put in a variable that comes from elsewhere (valueFrom).
FIELD_VALUES = {"metadata.name": "rollout-short-5d8f-x2", "status.podIP": "10.1.2.3",
                "metadata.labels['apps.kubernetes.io/pod-index']": "0"}


# -- rendering and access -----------------------------------------------------------------

def render_overlay(overlay: str) -> list[dict[str, Any]]:
    return render(K8S / "overlays" / overlay)


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def _kind(container: dict[str, Any]) -> str | None:
    """``coordinator`` ... ``rollout`` for a Libra service, ``rank`` for a trainer rank."""
    argv = container.get("command", []) + container.get("args", [])
    match = COMMAND.match(" ".join(argv))
    if not match:
        return None
    return "rank" if match.group(2) else match.group(1)


def libra_containers(
        docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(kind, workload, its container) of every Libra container."""
    out = []
    for doc in workloads(docs):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            kind = _kind(container)
            if kind is not None:
                out.append((kind, doc, container))
    return out


def container_env(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for var in container.get("env", []):
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            env[var["name"]] = FIELD_VALUES[source["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in source:
            env[var["name"]] = "<secret>"
        else:
            env[var["name"]] = str(var["value"])
    return env


def _config(kind: str, container: dict[str, Any]) -> Any:
    if kind == "rank":
        return load_config(RankConfig, "trainer_rank", argv=[], environ=container_env(container))
    return load_config(CONFIG_CLASSES[kind], kind, argv=[], environ=container_env(container))


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container.get("ports", [])}


def _selects(service: dict[str, Any], workload: dict[str, Any]) -> bool:
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def _service_target(docs: list[dict[str, Any]], address: str) -> tuple[Any, int] | None:
    """The (workload, container port) a ``service:port`` address reaches, or None."""
    host, _, port = address.rpartition(":")
    for svc in (d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == host):
        for sp in svc["spec"]["ports"]:
            if str(sp["port"]) != port:
                continue
            for workload in workloads(docs):
                if not _selects(svc, workload):
                    continue
                for container in workload["spec"]["template"]["spec"]["containers"]:
                    target = sp.get("targetPort", sp["port"])
                    found = (_ports(container).get(target) if isinstance(target, str)
                             else target)
                    if found is not None:
                        return workload, found
    return None


# -- the checks ---------------------------------------------------------------------------

def problems(docs: list[dict[str, Any]], dockerfile: str | None = None) -> list[str]:
    """Everything in the rendered manifests (and the image's Dockerfile, by default
    deploy/Dockerfile) that disagrees with the code."""
    out: list[str] = []
    for kind, workload, container in libra_containers(docs):
        where = f"{workload['metadata']['name']}/{container['name']}"
        out += [f"{where}: {p}" for p in _env_problems(kind, container)]
        if out:
            continue  # the checks below need a loadable config
        cfg = _config(kind, container)
        if kind == "rank":
            out += [f"{where}: {p}" for p in _rank_problems(docs, workload, cfg)]
            continue
        out += [f"{where}: {p}" for p in _port_problems(kind, workload, container, cfg)]
        out += [f"{where}: {p}" for p in _peer_problems(docs, kind, cfg)]
        out += [f"{where}: {p}" for p in _auth_problems(kind, workload, container, cfg)]
        if kind == "rollout":
            out += [f"{where}: {p}" for p in _rollout_problems(container, cfg)]
        if kind == "trainer":
            out += [f"{where}: {p}" for p in _trainer_problems(docs, workload, container, cfg)]
    dockerfile = DOCKERFILE.read_text() if dockerfile is None else dockerfile
    return (out + _reaper_problems(docs, dockerfile) + _toolgateway_problems(docs)
            + _redis_problems(docs))


def _env_problems(kind: str, container: dict[str, Any]) -> list[str]:
    cls, service = ((RankConfig, "trainer_rank") if kind == "rank"
                    else (CONFIG_CLASSES[kind], kind))
    known = set()
    for option in option_names(cls):
        suffix = option.replace(".", "__").upper()
        known |= {f"{ENV_PREFIX}{service.upper()}_{suffix}", f"{ENV_PREFIX}{suffix}"}
    out = [f"{name} is not an option of {cls.__name__}" for name in container_env(container)
           if name.startswith(ENV_PREFIX) and name not in known]
    if not out:
        try:
            _config(kind, container)
        except ValueError as exc:
            out.append(f"config does not load: {exc}")
    return out


def _port_problems(kind: str, workload: dict[str, Any], container: dict[str, Any],
                   cfg: Any) -> list[str]:
    out = []
    ports = _ports(container)
    if cfg.server.host != "0.0.0.0":
        out.append(f"server.host {cfg.server.host}: must listen on all interfaces")
    if ports.get("grpc") != cfg.server.port:
        out.append(f"container port grpc {ports.get('grpc')} != server.port {cfg.server.port}")
    if ports.get("metrics") != cfg.server.metrics_port:
        out.append(f"container port metrics {ports.get('metrics')} != server.metrics_port "
                   f"{cfg.server.metrics_port}")
    if kind == "coordinator" and ports.get("http") != cfg.http_port:
        out.append(f"container port http {ports.get('http')} != http_port {cfg.http_port}")
    notes = workload["spec"]["template"]["metadata"].get("annotations", {})
    if (notes.get("prometheus.io/scrape"), notes.get("prometheus.io/port")) != (
            "true", str(cfg.server.metrics_port)):
        out.append(f"Prometheus annotations {notes} do not scrape {cfg.server.metrics_port}")
    for probe, service in (("startupProbe", ""), ("readinessProbe", ""),
                           ("livenessProbe", LIVENESS_SERVICE)):
        grpc = container.get(probe, {}).get("grpc")
        if grpc is None or grpc.get("port") != cfg.server.port \
                or grpc.get("service", "") != service:
            out.append(f"{probe} must be gRPC health on {cfg.server.port} service "
                       f"{service!r}, got {container.get(probe)}")
    return out


def _peer_problems(docs: list[dict[str, Any]], kind: str, cfg: Any) -> list[str]:
    out = []
    main = (ROOT / "services" / kind / "__main__.py").read_text()
    for peer in sorted(set(re.findall(r"peers\.(coordinator|scheduler|trainer|toolgateway)\b",
                                      main))):
        address = getattr(cfg.peers, peer)
        target = _service_target(docs, address)
        if target is None:
            out.append(f"peers.{peer}={address} reaches no container port")
            continue
        workload, port = target
        peer_container = workload["spec"]["template"]["spec"]["containers"][0]
        if _kind(peer_container) != peer or port != _config(peer, peer_container).server.port:
            out.append(f"peers.{peer}={address} reaches {workload['metadata']['name']}:{port}")
    if hasattr(cfg, "redis_url") and not REDIS_URL.match(cfg.redis_url):
        out.append(f"redis_url {cfg.redis_url}: not the redis Service with the password")
    return out


def _secret_files(workload: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """Mounted path -> Secret key, for files of the libra Secret."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    out = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes.get(mount["name"], {}).get("secret")
        if secret and secret["secretName"] == SECRET:
            for item in secret.get("items", []):
                out[f"{mount['mountPath']}/{item['path']}"] = item["key"]
    return out


def _auth_problems(kind: str, workload: dict[str, Any], container: dict[str, Any],
                   cfg: Any) -> list[str]:
    files = _secret_files(workload, container)
    out = []
    if files.get(cfg.auth.service_token_file) != "service-token" or cfg.auth.service_token:
        out.append("auth.service_token_file must be the Secret's service-token")
    if kind == "coordinator":
        if files.get(cfg.auth.api_token_file) != "api-token" or cfg.auth.api_token:
            out.append("auth.api_token_file must be the Secret's api-token")
    elif cfg.auth.api_token or cfg.auth.api_token_file:
        out.append("has no public methods: no api token")
    return out


def _rollout_problems(container: dict[str, Any], cfg: Any) -> list[str]:
    layout = tomllib.loads(DEMO_JOB.read_text())["layout"]["buckets"]
    buckets = {b["name"]: b for b in layout}
    if cfg.bucket not in buckets:
        return [f"bucket {cfg.bucket} is not one of the demo job's {sorted(buckets)}"]
    bucket, out = buckets[cfg.bucket], []
    if (cfg.max_batch_size, cfg.max_trajectories) != (
            bucket["max_batch_size"], bucket["max_trajectories_per_instance"]):
        out.append(f"caps ({cfg.max_batch_size}, {cfg.max_trajectories}) differ from bucket "
                   f"{cfg.bucket}")
    if cfg.instance_id != FIELD_VALUES["metadata.name"]:
        out.append("instance_id must be the pod name (unique per replica)")
    if cfg.advertise_host != FIELD_VALUES["status.podIP"]:
        out.append("advertise_host must be the pod IP (peers dial it)")
    gpus = int(container.get("resources", {}).get("limits", {}).get(GPU, 0))
    wanted = cfg.vllm_tensor_parallel_size if cfg.engine == "vllm" else 0
    if gpus != wanted:
        out.append(f"{gpus} GPU(s) for engine {cfg.engine} with TP "
                   f"{cfg.vllm_tensor_parallel_size}: want {wanted}")
    return out


def _trainer_problems(docs: list[dict[str, Any]], workload: dict[str, Any],
                      container: dict[str, Any], cfg: Any) -> list[str]:
    out = []
    target = _service_target(docs, cfg.rendezvous.address)
    port = int(cfg.rendezvous.address.rpartition(":")[2])
    if target is None or target[0] is not workload or target[1] != port \
            or _ports(container).get("rendezvous") != port:
        out.append(f"rendezvous.address {cfg.rendezvous.address} does not reach this "
                   f"trainer's rendezvous port")
    ranks = [w for kind, w, _ in libra_containers(docs) if kind == "rank"]
    count = sum(w["spec"]["replicas"] for w in ranks)
    if count != cfg.num_ranks - 1:
        out.append(f"num_ranks {cfg.num_ranks} but {count} trainer-rank pods")
    gpus = {int(c.get("resources", {}).get("limits", {}).get(GPU, 0))
            for kind, _, c in libra_containers(docs) if kind in ("trainer", "rank")}
    if len(gpus) != 1 or gpus - {0, 1}:
        out.append(f"every rank needs the same GPU count (0 or 1), got {sorted(gpus)}")
    return out


def _rank_problems(docs: list[dict[str, Any]], workload: dict[str, Any],
                   cfg: RankConfig) -> list[str]:
    trainer = next(c for kind, _, c in libra_containers(docs) if kind == "trainer")
    wanted = _config("trainer", trainer).rendezvous.address
    out = []
    if cfg.rendezvous != wanted:
        out.append(f"rendezvous {cfg.rendezvous} != the trainer's {wanted}")
    if (cfg.rank, cfg.rank_offset) != (0, 1):
        out.append("rank must be the pod index with rank_offset 1 (rank 0 is the trainer)")
    if workload["kind"] != "StatefulSet":
        out.append("ranks need stable pod indexes: a StatefulSet")
    return out


def _reaper_problems(docs: list[dict[str, Any]], dockerfile: str) -> list[str]:
    """PID 1 must reap orphans: python never does, so a tool's killed leftovers would
    stay zombies (their sandbox uid out of the pool) and other services' orphans pile up.
    The image's ENTRYPOINT is tini; a container ``command`` would replace it."""
    out = []
    if image_entrypoint(dockerfile) != INIT_ENTRYPOINT:
        out.append(f"image: ENTRYPOINT is not {INIT_ENTRYPOINT}: no init reaps orphans")
    for _, workload, container in libra_containers(docs):
        if "command" in container:
            out.append(f"{workload['metadata']['name']}/{container['name']}: command "
                       "replaces the image's init (tini), so nothing reaps orphaned "
                       "processes; set args")
    return out


def _toolgateway_problems(docs: list[dict[str, Any]]) -> list[str]:
    out = []
    for kind, workload, container in libra_containers(docs):
        if kind != "toolgateway":
            continue
        sc, pod = container.get("securityContext", {}), workload["spec"]["template"]["spec"]
        if not (sc.get("runAsNonRoot") and sc.get("readOnlyRootFilesystem")
                and sc.get("allowPrivilegeEscalation") is False
                and sc.get("capabilities", {}).get("drop") == ["ALL"]
                and sc.get("seccompProfile", {}).get("type") == "RuntimeDefault"):
            out.append(f"toolgateway: securityContext not restricted: {sc}")
        if pod.get("automountServiceAccountToken") is not False:
            out.append("toolgateway: must not mount an API token")
        labels = workload["spec"]["template"]["metadata"]["labels"]
        denies = [p for p in docs if p["kind"] == "NetworkPolicy"
                  and all(labels.get(k) == v for k, v in
                          p["spec"]["podSelector"]["matchLabels"].items())
                  and "Egress" in p["spec"].get("policyTypes", [])]
        if not denies or any(p["spec"].get("egress") for p in denies):
            out.append("toolgateway: no NetworkPolicy denying all egress")
    return out


def _redis_problems(docs: list[dict[str, Any]]) -> list[str]:
    redis = next((d for d in workloads(docs) if d["metadata"]["name"] == "redis"), None)
    if redis is None:
        return ["no redis StatefulSet"]
    container = redis["spec"]["template"]["spec"]["containers"][0]
    args, out = container["args"], []
    if args[args.index("--appendonly") + 1] != "yes":
        out.append("redis: AOF off")
    if args[args.index("--requirepass") + 1] != "$(REDIS_PASSWORD)":
        out.append("redis: no password")
    claims = {c["metadata"]["name"] for c in redis["spec"].get("volumeClaimTemplates", [])}
    data = [m for m in container["volumeMounts"] if m["mountPath"] == "/data"]
    if not data or data[0]["name"] not in claims:
        out.append("redis: /data is not on a persistent volume claim")
    if _service_target(docs, "redis:6379") is None:
        out.append("redis: no Service on 6379")
    return out
