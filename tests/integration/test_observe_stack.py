"""`libra up --observe`: the real stack with Arize Phoenix beside it.

Real: Redis and the five service processes started by the launcher, Phoenix from its
virtualenv (``make observe-venv``; ``LIBRA_PHOENIX_VENV`` points elsewhere), a short job
run to completion, the services' spans read back from Phoenix's REST API, `libra logs`
and `libra down` on the same stack. Skipped only when the Phoenix virtualenv is absent.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from libra import types as t
from libra_cli import stack
from libra_cli.main import main
from libra_cli.observe import ObserveOptions, default_venv
from libra_cli.redis_server import pid_alive
from tests.integration.stack_helpers import ROOT, small_job, wait_for_job, write_stack

pytestmark = pytest.mark.integration

VENV = default_venv(ROOT)
# gRPC server spans are named /libra.proto.<service>.v1.<Service>/<Method>.
SERVED_BY = re.compile(r"^/libra\.proto\.(\w+)\.v1\.")


def spans(url: str) -> list[dict[str, Any]]:
    """Every span of Phoenix's default project (the REST API pages by cursor)."""
    out: list[dict[str, Any]] = []
    cursor = ""
    while True:
        query = f"?limit=1000{'&cursor=' + cursor if cursor else ''}"
        with urllib.request.urlopen(f"{url}/v1/projects/default/spans{query}",
                                    timeout=10) as reply:
            page = json.loads(reply.read())
        out += page["data"]
        cursor = page.get("next_cursor") or ""
        if not cursor:
            return out


def services_seen(url: str) -> set[str]:
    return {m.group(1) for span in spans(url) if (m := SERVED_BY.match(span["name"]))}


@pytest.mark.skipif(not (VENV / "bin" / "phoenix").exists(),
                    reason=f"no Phoenix virtualenv at {VENV}: `make observe-venv` "
                    "builds it (or set LIBRA_PHOENIX_VENV)")
async def test_observed_stack_sends_every_services_spans_to_phoenix(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run_root = tmp_path / "runs"
    run_root.mkdir()
    state = stack.up(run_root, write_stack(run_root / "stack.toml", restart_limit=0),
                     timeout_s=240, observe=ObserveOptions(VENV))
    viewer = state["observe"]
    try:
        # 1) `libra status` lists the viewer, answering, with its URL.
        (row,) = [r for r in stack.status(state) if r["name"] == "phoenix"]
        assert (row["health"], row["url"]) == ("SERVING", viewer["url"])
        assert Path(viewer["working_dir"]).is_relative_to(run_root)
        # 2) A short job through the services.
        client = stack.coordinator_client(state)
        job = await client.create_job(small_job(), "json")
        job, _steps, _counters = await wait_for_job(client, job.job_id)
        await client.close()
        assert job.state is t.JobState.SUCCEEDED, job.message
        # 3) Their spans arrive (batched: exported within seconds of ending).
        wanted = {"coordinator", "scheduler", "trainer", "toolgateway"}
        for _ in range(120):
            if wanted <= services_seen(viewer["url"]):
                break
            await asyncio.sleep(0.5)
        assert wanted <= services_seen(viewer["url"])
        # 4) `libra logs` reads the viewer's log and a service's, as JSON records.
        assert main(["--run-root", str(run_root), "logs", "phoenix"]) == 0
        assert "Phoenix" in capsys.readouterr().out
        assert main(["--run-root", str(run_root), "logs", "coordinator", "--json",
                     "--since", "1h"]) == 0
        records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert records and all(r["service"] == "coordinator" for r in records)
    finally:
        stack.down(run_root)
    # 5) `libra down` stopped the viewer by pid with the rest.
    assert not pid_alive(int(viewer["pid"]))
    assert stack.read_state(run_root) is None
