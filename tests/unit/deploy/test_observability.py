"""deploy/observability: dashboards, scrape configs and the collector config in step with
the code. Every PromQL query names only metrics the services export (libra/metrics.py,
the one registry); the dashboards are what scripts/gen_dashboards.py writes; the scrape
targets are the compose services' metrics ports; the compose `observe` profile mounts
these files where its images read them and wires Grafana, the collector and the trace
backend by compose service names; docs/observability.md carries the registry's table;
``promtool`` checks the scrape configs and the alert rules, and unit-tests the
stopped-service alert (Debian package ``prometheus``, installed by ``make system``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from libra import metrics

ROOT = Path(__file__).resolve().parents[3]
OBS = ROOT / "deploy" / "observability"
DASHBOARDS = sorted((OBS / "grafana" / "dashboards").glob("*.json"))
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
METRIC_NAME = re.compile(r"\blibra_[a-z0-9_]+\b")
UP_QUERY = 'up{job="libra"}'
METRICS_PORT_ENV = re.compile(r"^LIBRA_([A-Z]+)_SERVER__METRICS_PORT$")

sys.path.insert(0, str(ROOT / "scripts"))
import gen_dashboards  # noqa: E402


def queries(path: Path) -> list[str]:
    model = json.loads(path.read_text())
    found = [target["expr"] for panel in model["panels"] for target in panel["targets"]]
    found += [var["query"]["query"] for var in model["templating"]["list"]]
    return found


def test_the_four_dashboards_are_shipped() -> None:
    assert {p.stem for p in DASHBOARDS} == {"overview", "rollout-scheduler",
                                            "training-elastic", "tools"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_query_names_only_exported_metrics(path: Path) -> None:
    exported = metrics.exported_series()
    for expr in queries(path):
        names = set(METRIC_NAME.findall(expr))
        if expr == UP_QUERY:  # Prometheus's own series of its scrapes of Libra
            continue
        assert names, f"{path.name}: query names no Libra metric: {expr}"
        assert names <= exported, f"{path.name}: not exported: {sorted(names - exported)}"


def test_a_misspelt_metric_is_caught() -> None:
    """The check above is not vacuous: a counter without ``_total`` is not a series."""
    assert "libra_tool_calls" not in metrics.exported_series()
    assert "libra_tool_calls_total" in metrics.exported_series()
    assert "libra_job_step_phase_seconds" not in metrics.exported_series()


def test_dashboards_cover_every_job_and_service_metric() -> None:
    used = {name for path in DASHBOARDS for expr in queries(path)
            for name in METRIC_NAME.findall(expr)}
    for d in metrics.DEFINITIONS:
        if d.name != "libra_rpc_server_seconds":  # per-RPC latency: ad hoc, not a panel
            assert used & set(d.series()), f"{d.name} is on no dashboard"


def test_dashboards_are_what_the_generator_writes() -> None:
    rendered = gen_dashboards.rendered()
    assert set(rendered) == {p.name for p in DASHBOARDS}
    for path in DASHBOARDS:
        assert path.read_text() == rendered[path.name], \
            f"{path.name} is stale: run python scripts/gen_dashboards.py"


def test_dashboards_use_the_provisioned_datasource() -> None:
    provisioned = yaml.safe_load(
        (OBS / "grafana" / "provisioning" / "datasources" / "libra.yaml").read_text())
    uids = {d["uid"] for d in provisioned["datasources"]}
    for path in DASHBOARDS:
        model = json.loads(path.read_text())
        assert {p["datasource"]["uid"] for p in model["panels"]} <= uids


def compose_metrics_targets() -> set[str]:
    """``service:port`` of every compose service that serves /metrics."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    targets = set()
    for name, service in services.items():
        for key, val in (service.get("environment") or {}).items():
            if METRICS_PORT_ENV.match(key) and int(val) >= 0:
                targets.add(f"{name}:{int(val)}")
    return targets


def test_scrape_targets_are_the_compose_services_metrics_ports() -> None:
    config = yaml.safe_load((OBS / "prometheus.yml").read_text())
    scraped = {target for job in config["scrape_configs"]
               for static in job.get("static_configs", []) for target in static["targets"]}
    expected = compose_metrics_targets()
    assert len(expected) == 6  # coordinator, scheduler, trainer, toolgateway, 2 rollouts
    assert scraped == expected


def test_k8s_scrape_keeps_the_annotated_libra_pods() -> None:
    config = yaml.safe_load((OBS / "prometheus-k8s.yml").read_text())
    (job,) = config["scrape_configs"]
    keep = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"]
            if r.get("action") == "keep"}
    assert keep == {"__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
                    "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": "libra"}
    base = ROOT / "deploy" / "k8s" / "base"
    annotated = [doc for f in sorted(base.glob("*.yaml"))
                 for doc in yaml.safe_load_all(f.read_text())
                 if doc and doc.get("kind") in ("Deployment", "StatefulSet")
                 and (doc["spec"]["template"]["metadata"].get("annotations") or {})
                 .get("prometheus.io/scrape") == "true"]
    assert len(annotated) >= 5
    for doc in annotated:
        notes = doc["spec"]["template"]["metadata"]["annotations"]
        ports = {p["containerPort"] for c in doc["spec"]["template"]["spec"]["containers"]
                 for p in c.get("ports", []) if p.get("name") == "metrics"}
        assert ports == {int(notes["prometheus.io/port"])}, doc["metadata"]["name"]


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not on PATH: `make system` installs it (Debian package "
                    "`prometheus`; scripts/setup_system.sh)")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60,
                          cwd=OBS)


def test_promtool_checks_the_compose_scrape_config_and_its_rules() -> None:
    """Not --syntax-only: the rule files it names are found and checked too."""
    result = _promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rules found" in result.stdout + result.stderr


def test_promtool_checks_the_k8s_scrape_config(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes service discovery (it refuses the
    ``kubernetes_sd_configs`` field itself): where it does, the rest of the file (scrape
    settings, relabel rules) is checked with that one field swapped for static targets."""
    result = _promtool("check", "config", "--syntax-only", "prometheus-k8s.yml")
    out = result.stdout + result.stderr
    if result.returncode != 0 and "field kubernetes_sd_configs not found" in out:
        config = yaml.safe_load((OBS / "prometheus-k8s.yml").read_text())
        for job in config["scrape_configs"]:
            assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
            job["static_configs"] = [{"targets": ["pod:9100"]}]
        copy = tmp_path / "prometheus-k8s.yml"
        copy.write_text(yaml.safe_dump(config))
        result = _promtool("check", "config", "--syntax-only", str(copy))
        out = result.stdout + result.stderr
    assert result.returncode == 0, out


def test_a_stopped_service_fires_the_service_down_alert() -> None:
    """alerts-test.yml: the scheduler's scrapes fail from minute 2; a minute later
    LibraServiceDown fires for it alone (promtool evaluates the rules on those series)."""
    result = _promtool("test", "rules", "alerts-test.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The rule checks above are not vacuous."""
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: A\n"
                      "        expr: up{job=\"libra\" == 0\n")
    assert _promtool("check", "rules", str(broken)).returncode != 0


def test_the_overview_shows_which_targets_are_up() -> None:
    assert UP_QUERY in queries(OBS / "grafana" / "dashboards" / "overview.json")
    rules = yaml.safe_load((OBS / "alerts.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert exprs["LibraServiceDown"] == f"{UP_QUERY} == 0"
    # The job name the rule and the panel select is the scrape job's.
    config = yaml.safe_load((OBS / "prometheus.yml").read_text())
    assert [job["job_name"] for job in config["scrape_configs"]] == ["libra"]
    assert config["rule_files"] == ["alerts.yml"]


# -- the compose `observe` profile ---------------------------------------------------------

OBSERVE = {"prometheus", "grafana", "otel-collector", "jaeger"}


def observe_services() -> dict[str, dict]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {name: svc for name, svc in services.items() if svc.get("profiles")}


def bind_mounts(svc: dict) -> list[tuple[Path, str]]:
    """(host path, container path) of every bind mount (a relative source)."""
    out = []
    for volume in svc.get("volumes", []):
        source, target = str(volume).split(":")[:2]
        if source.startswith("."):
            out.append(((COMPOSE.parent / source).resolve(), target))
    return out


def test_observability_services_are_in_the_observe_profile_only() -> None:
    """The default `docker compose up` is unchanged: all four need --profile observe."""
    services = observe_services()
    assert set(services) == OBSERVE
    assert all(svc["profiles"] == ["observe"] for svc in services.values())
    assert all(":" in svc["image"] and not svc["image"].endswith(":latest")
               for svc in services.values()), "pin the images"


def test_observe_mounts_exist_where_the_images_read_them() -> None:
    services = observe_services()
    mounts = {name: dict((target, host) for host, target in bind_mounts(svc))
              for name, svc in services.items()}
    for name, found in mounts.items():
        for target, host in found.items():
            assert host.exists(), f"{name}: {host} (mounted at {target}) does not exist"
    prom = mounts["prometheus"]
    assert prom["/etc/prometheus/prometheus.yml"] == OBS / "prometheus.yml"
    assert prom["/etc/prometheus/alerts.yml"] == OBS / "alerts.yml"
    command = services["prometheus"]["command"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in command
    assert mounts["otel-collector"]["/etc/otelcol/config.yaml"] == OBS / "otel-collector.yaml"
    assert "--config=/etc/otelcol/config.yaml" in services["otel-collector"]["command"]
    grafana = mounts["grafana"]
    assert grafana["/etc/grafana/provisioning"] == OBS / "grafana" / "provisioning"
    provider = yaml.safe_load(
        (OBS / "grafana" / "provisioning" / "dashboards" / "libra.yaml").read_text())
    (folder,) = [p["options"]["path"] for p in provider["providers"]]
    assert grafana[folder] == OBS / "grafana" / "dashboards"


def test_grafana_and_the_collector_reach_compose_services() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    datasource = yaml.safe_load(
        (OBS / "grafana" / "provisioning" / "datasources" / "libra.yaml").read_text())
    (url,) = [d["url"] for d in datasource["datasources"]]
    host, port = url.removeprefix("http://").split(":")
    assert host in services and "--config.file" in " ".join(services[host]["command"])
    assert port == "9090"  # Prometheus's listen port (its image's default)
    backend = services["otel-collector"]["environment"]["LIBRA_TRACE_BACKEND"]
    assert backend.split(":")[0] in services, backend
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"


def test_every_service_exports_traces_to_one_configurable_endpoint() -> None:
    """LIBRA_OTLP_ENDPOINT (empty by default: no export) reaches every Libra service."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    libra = {name for name, svc in services.items()
             if " ".join(svc.get("command") or []).startswith("python -m services.")}
    assert len(libra) == 6
    for name in libra:
        env = services[name]["environment"]
        (value,) = [v for k, v in env.items() if k.endswith("_TELEMETRY__OTLP_ENDPOINT")]
        assert value == "${LIBRA_OTLP_ENDPOINT:-}", name


def test_collector_pipelines_name_defined_components() -> None:
    config = yaml.safe_load((OBS / "otel-collector.yaml").read_text())
    for pipeline in config["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            assert set(pipeline[kind]) <= set(config[kind]), kind
    assert set(config["service"]["extensions"]) <= set(config["extensions"])
    grpc_port = config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"].rsplit(":", 1)[1]
    # The services' (commented) OTLP endpoint in compose names this port.
    assert f"otel-collector:{grpc_port}" in COMPOSE.read_text()


def test_docs_carry_the_registry_table() -> None:
    doc = (ROOT / "docs" / "observability.md").read_text()
    assert metrics.markdown_table() in doc, \
        "docs/observability.md is stale: paste `python -m libra.metrics`"


def test_no_label_is_a_per_trajectory_id() -> None:
    unbounded = {"trajectory", "trajectory_id", "group", "group_id", "call_id", "prompt"}
    for d in metrics.DEFINITIONS:
        assert not set(d.labels) & unbounded, d.name
        assert re.fullmatch(r"libra_[a-z0-9_]+", d.name), d.name
    assert len({d.name for d in metrics.DEFINITIONS}) == len(metrics.DEFINITIONS)
