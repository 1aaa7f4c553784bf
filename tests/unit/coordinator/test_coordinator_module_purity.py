"""The coordinator's pure modules beside its core (the core itself is checked in
``tests/unit/test_core_purity.py``) import no grpc, redis, torch or generated protobuf
code: the in-memory store and the in-process client run in a one-process loop without
them. Checked in a fresh interpreter so other tests' imports don't hide a violation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("grpc", "redis", "torch", "transformers", "libra.proto")


@pytest.mark.parametrize("module", [
    "services.coordinator.memory_store", "services.coordinator.store_protocol",
    "services.coordinator.inprocess", "services.coordinator.spec_checks",
    "services.coordinator.worker_registry", "services.coordinator.elastic_jobs",
    "services.coordinator.elastic_executor", "services.coordinator.elastic_protocols",
])
def test_module_imports_no_heavy_dependency(module: str) -> None:
    code = (f"import sys, {module}; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
