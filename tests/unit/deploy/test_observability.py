"""deploy/observability: dashboards, scrape configs and the collector config in step with
the code. Every PromQL query names only metrics the services export (libra/metrics.py,
the one registry); the dashboards are what scripts/gen_dashboards.py writes; the scrape
targets are the compose services' metrics ports; docs/observability.md carries the
registry's table; ``promtool check config`` passes where promtool is installed."""

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


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-k8s.yml"])
def test_promtool_checks_the_scrape_config(name: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not on PATH (Debian package `prometheus`); "
                    "the YAML checks above still ran")
    result = subprocess.run([promtool, "check", "config", "--syntax-only", str(OBS / name)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


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
