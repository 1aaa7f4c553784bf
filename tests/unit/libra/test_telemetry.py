"""Telemetry setup: spans cost nothing where nothing exports them."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: the global tracer provider can be set once per process, and
# other tests of this session install one.
_NO_EXPORTER = """
from opentelemetry import trace
from libra import telemetry
from libra.service_config import TelemetryConfig
before = trace.get_tracer_provider()
assert telemetry.init_tracing("test", TelemetryConfig()) is None
assert trace.get_tracer_provider() is before
with telemetry.tracer("test").start_as_current_span("work") as span:
    assert not span.is_recording()
assert not telemetry._instrumented
print("ok")
"""


def test_without_an_exporter_the_no_op_provider_stays_and_nothing_is_instrumented() -> None:
    out = subprocess.run([sys.executable, "-c", _NO_EXPORTER], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
