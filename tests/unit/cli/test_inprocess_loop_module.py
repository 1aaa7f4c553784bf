"""The in-process loop (libra_cli/inprocess_loop.py) stays what a newcomer can read first:
short, wiring only (cores, in-process clients, stores; no server), and its walk of one
trajectory names files and functions that exist. Read from the source: nothing runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "libra_cli/inprocess_loop.py"
MAX_LINES = 180

# What the loop may import, by module name. Services: their cores, in-process clients,
# Redis stores and the adapters and checks each service's __main__ passes to its core.
ALLOWED_SERVICE_MODULES = re.compile(
    r"services\.\w+\.(core|inprocess|store|config|backend|distributed|model_check"
    r"|dataset_check|init_from_check)$")
ALLOWED_OTHER = {"asyncio", "contextlib", "logging", "threading", "collections.abc", "dataclasses",
                 "pathlib", "typing", "__future__", "redis.asyncio", "libra.clock",
                 "libra.data_roots", "libra.jobspec", "libra_cli.redis_server"}
# The gateway's one builder of its tools, rewards and sandbox lives in its __main__,
# which defines a server but starts none: the loop takes that function alone.
GATEWAY_BUILDER = ("services.toolgateway.__main__", ("build_core",))
SERVER_MODULES = re.compile(r"^(grpc|libra\.grpcx|libra\.proto)(\.|$)|\.servicer$|\.rest$")


def _imports() -> list[tuple[str, tuple[str, ...]]]:
    tree = ast.parse(SOURCE.read_text())
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", tuple(a.name for a in node.names)))
    return found


def test_the_loop_module_stays_short() -> None:
    num_lines = len(SOURCE.read_text().splitlines())
    assert num_lines <= MAX_LINES, f"{SOURCE.name} has {num_lines} lines (at most {MAX_LINES})"


def test_the_loop_imports_only_cores_clients_stores_and_no_server() -> None:
    for module, names in _imports():
        assert not SERVER_MODULES.search(module), f"the loop imports a server part: {module}"
        if (module, names) == GATEWAY_BUILDER:
            continue
        assert (module in ALLOWED_OTHER or ALLOWED_SERVICE_MODULES.match(module)), (
            f"the loop imports {module} {names}: not a core, in-process client, store or "
            "the adapter a service's __main__ passes to its core")


def test_the_loop_uses_no_memory_store_and_every_core() -> None:
    """One world: the real Redis stores (the docstring says why), all five cores."""
    modules = {module for module, _ in _imports()}
    assert not any(m.endswith("memory_store") for m in modules)
    for service in ("coordinator", "scheduler", "rollout", "trainer"):
        assert f"services.{service}.core" in modules
        assert f"services.{service}.store" in modules
    assert "services.toolgateway.inprocess" in modules


def test_the_walk_of_one_trajectory_names_files_and_functions_that_exist() -> None:
    doc = ast.get_docstring(ast.parse(SOURCE.read_text())) or ""
    paths = re.findall(r"``((?:services|libra\w*)/[\w/*.]+)``", doc)
    assert len(paths) >= 15, paths
    for path in paths:
        if "*" in path:
            assert list(ROOT.glob(path)), f"docstring names {path}: nothing matches"
        else:
            assert (ROOT / path).exists(), f"docstring names {path}: it does not exist"
    # "``file.py`` ``name``" (or ``a``/``b``): each function is defined in that file.
    for path, names in re.findall(r"``([\w/]+\.py)``\s+((?:``\w+``/?)+)", doc):
        text = (ROOT / path).read_text()
        for name in re.findall(r"``(\w+)``", names):
            assert re.search(rf"def {name}\(", text), f"{path} defines no {name}()"
