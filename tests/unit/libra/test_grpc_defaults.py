"""Libra's GRPC_EXPERIMENTS default: set by ``import libra``, kept when the user set
the variable, and in place before the first import of grpc in every entry point (gRPC
core reads it only then). Each check runs in a fresh interpreter whose environment
lacks the variable (this process imported libra, so it has it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from libra import GRPC_EXPERIMENTS_DEFAULT

ROOT = Path(__file__).resolve().parents[3]

# Imports argv[1]; prints GRPC_EXPERIMENTS as it is when grpc is first looked up and
# exits there (what the entry point imports after grpc, torch for some, cannot change
# that value: no need to wait for it).
PROBE = """
import importlib, os, sys
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            print(os.environ.get("GRPC_EXPERIMENTS", "<unset>"), flush=True)
            os._exit(0)
        return None
sys.meta_path.insert(0, Probe())
importlib.import_module(sys.argv[1])
print("<grpc not imported>")
"""


def _run(code: str, *args: str, experiments: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if experiments is not None:
        env["GRPC_EXPERIMENTS"] = experiments
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.parametrize(("given", "expected"), [
    (None, GRPC_EXPERIMENTS_DEFAULT),
    ("", ""),  # explicitly empty: gRPC's own defaults
    ("event_engine_client", "event_engine_client"),
])
def test_import_sets_the_default_unless_the_user_chose(given: str | None,
                                                       expected: str) -> None:
    code = "import os, libra; print(repr(os.environ['GRPC_EXPERIMENTS']))"
    assert _run(code, experiments=given) == repr(expected)


@pytest.mark.parametrize("entry_point", [
    "services.coordinator.__main__", "services.scheduler.__main__",
    "services.rollout.__main__", "services.trainer.__main__",
    "services.toolgateway.__main__", "libra_cli.main", "libra_cli.healthcheck",
])
def test_default_is_in_place_before_grpc_is_imported(entry_point: str) -> None:
    assert _run(PROBE, entry_point) == GRPC_EXPERIMENTS_DEFAULT
