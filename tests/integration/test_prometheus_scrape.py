"""A real Prometheus scraping Libra services with the shipped config, one of them stopped.

Real: Prometheus (Debian package ``prometheus``, installed by ``make system``) run with
deploy/observability/prometheus.yml and alerts.yml (targets rewritten to this host's
ports, intervals shortened), two Libra gRPC servers serving /metrics
(``libra.grpcx.Server``). Stopping one makes its ``up`` 0 and its LibraServiceDown alert
pending while the other target stays up; nothing waits on the failed scrape.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from libra.grpcx import Server
from libra.service_config import ServerConfig
from libra_cli.redis_server import free_ports
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

OBS = Path(__file__).resolve().parents[2] / "deploy" / "observability"


def _config(tmp_path: Path, ports: dict[str, int]) -> Path:
    """The shipped scrape config with its static targets moved to ``ports`` (the same
    ``service`` labels and relabelling), 1 s intervals, alerts.yml beside it."""
    config = yaml.safe_load((OBS / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s",
                            evaluation_interval="1s")
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{port}"], "labels": {"service": name}}
                             for name, port in ports.items()]
    shutil.copy(OBS / "alerts.yml", tmp_path / "alerts.yml")
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def _api(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())["data"]
    except OSError:
        return None  # not listening yet


def _up(port: int) -> dict[str, float]:
    data = _api(port, "query", query='up{job="libra"}')
    if not data:
        return {}
    return {r["metric"]["service"]: float(r["value"][1]) for r in data["result"]}


def _pending_alerts(port: int) -> list[dict[str, str]]:
    data = _api(port, "alerts") or {"alerts": []}
    return [a["labels"] for a in data["alerts"] if a["labels"]["alertname"] == "LibraServiceDown"]


async def test_a_stopped_service_is_down_for_prometheus_and_the_others_stay_up(
        tmp_path: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.fail("prometheus not on PATH: `make system` installs it (Debian package "
                    "`prometheus`; scripts/setup_system.sh)")
    servers = {name: Server(name, ServerConfig(port=0, metrics_port=0, shutdown_grace_s=1.0),
                            []) for name in ("coordinator", "scheduler")}
    for srv in servers.values():
        await srv.start()
    stopped: set[str] = set()
    (web_port,) = free_ports(1)
    config = _config(tmp_path, {name: srv.metrics_port for name, srv in servers.items()})
    proc = subprocess.Popen([prometheus, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{web_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_until(lambda: _up(web_port) == {"coordinator": 1.0, "scheduler": 1.0},
                         timeout_s=60)
        rules = _api(web_port, "rules")
        names = {r["name"] for g in rules["groups"] for r in g["rules"]}
        assert names == {"LibraServiceDown", "LibraRedisSlow"}
        await servers["scheduler"].stop()
        stopped.add("scheduler")
        await wait_until(lambda: _up(web_port) == {"coordinator": 1.0, "scheduler": 0.0},
                         timeout_s=60)
        await wait_until(lambda: _pending_alerts(web_port), timeout_s=60)
        (alert,) = _pending_alerts(web_port)
        assert alert["service"] == "scheduler"
        assert alert["target"] == f"127.0.0.1:{servers['scheduler'].metrics_port}"
        assert _up(web_port)["coordinator"] == 1.0  # still scraped, every second
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for name, srv in servers.items():
            if name not in stopped:
                await srv.stop()
