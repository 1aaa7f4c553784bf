"""Each service core imports no grpc, redis, torch, datasets or generated protobuf code
(house rule: pure core, thin shell; ``datasets`` loads lazily on the first file dataset).
Checked in a fresh interpreter so other tests' imports don't hide a violation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("grpc", "redis", "torch", "transformers", "vllm", "libra.proto", "datasets",
         "pyarrow", "pandas")


@pytest.mark.parametrize("module", [
    "services.coordinator.core", "services.scheduler.core", "services.rollout.core",
    "services.trainer.core", "services.toolgateway.core", "scheduling.policy",
    "scheduling.planner", "sim",
    # The agent endpoint's pure parts (docs/agent-endpoint.md).
    "services.coordinator.episode_core", "services.coordinator.episode_endpoint",
    "services.rollout.external_agent",
])
def test_core_imports_no_heavy_dependency(module: str) -> None:
    code = (f"import sys, {module}; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


@pytest.mark.parametrize("module", ["services.coordinator.__main__",
                                    "services.scheduler.__main__"])
def test_light_services_start_without_torch(module: str) -> None:
    """The coordinator and scheduler import torch/transformers only for the jobs that
    need them (the model and init_from checks, lazily): at start-up all services import
    at once, and seconds of torch import on a loaded machine made peers time out."""
    code = (f"import sys, {module}; "
            "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
