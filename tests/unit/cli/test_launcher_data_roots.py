"""The launcher gives the coordinator and the tool gateway the same data roots, each as
loaded by the service's own config loader (``libra_cli.launcher._plan``)."""

from __future__ import annotations

from pathlib import Path

from libra.config import load_config
from libra.data_roots import DEFAULT_DATA_ROOTS
from libra_cli.launcher import ROOT, _plan
from services.coordinator.config import CoordinatorConfig
from services.toolgateway.config import ToolGatewayConfig


def loaded_roots(stack: dict, run_root: Path) -> tuple[list[str], list[str]]:
    procs = {p.name: p for p in _plan(stack, run_root)}
    coordinator = load_config(CoordinatorConfig, "coordinator",
                              argv=procs["coordinator"].args, environ={})
    gateway = load_config(ToolGatewayConfig, "toolgateway",
                          argv=procs["toolgateway"].args, environ={})
    return coordinator.tool_data_roots, gateway.data_roots


def test_both_services_get_the_default_roots(tmp_path: Path) -> None:
    coordinator, gateway = loaded_roots({}, tmp_path)
    assert coordinator == gateway == [str(Path(r).resolve()) for r in DEFAULT_DATA_ROOTS]


def test_the_stack_files_roots_reach_both_resolved_against_the_repository(
        tmp_path: Path) -> None:
    coordinator, gateway = loaded_roots({"data_roots": ["deploy/data", str(tmp_path)]},
                                        tmp_path)
    assert coordinator == gateway == [str(ROOT / "deploy" / "data"), str(tmp_path.resolve())]
