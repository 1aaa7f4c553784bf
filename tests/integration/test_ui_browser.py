"""The live view during a real job: `libra up` runs Redis and the five services (the
package's shared stack); a job trains while a headless Chromium (Selenium) opens /ui,
sees the reward curve gain points between polls and logs no console error; `libra top
--once` renders a frame from the same stack and `libra status` shows the running job's
counters.

Real: every service process, Redis, the coordinator's HTTP server, Chromium and
chromedriver (skipped, saying why, only when those two are not installed).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from libra.bottleneck import VERDICTS
from libra_cli import stack
from libra_cli.stack_secrets import secrets_dir
from tests.integration.stack_helpers import ROOT, small_job, wait_for_step

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HAS_BROWSER = CHROMIUM.exists() and Path(CHROMEDRIVER).exists()
# Far more steps than the module lasts (a step takes 0.1 s or more), so the job is still
# running when every check is done, on a quiet machine or beside another test process
# (it is cancelled at the end): "running" is then a fact, not a race. (200 steps once
# ended before `libra status` looked, in a parallel run.)
NUM_STEPS = 10_000
WAIT_S = 240.0  # a step takes seconds here; minutes on a loaded shared machine


@pytest.fixture(scope="module")
def running_stack(shared_stack_for_module: dict[str, Any]) -> dict[str, Any]:
    """The package's shared stack (conftest.py) for the whole module: its tests watch one
    job, started once below."""
    return shared_stack_for_module


@pytest.fixture(scope="module")
def running_job(running_stack: dict[str, Any]) -> Iterator[str]:
    """A job that has reported its first step; cancelled after the module's checks."""

    async def start() -> str:
        client = stack.coordinator_client(running_stack)
        try:
            job = await client.create_job(small_job(num_steps=NUM_STEPS), "json")
            await wait_for_step(client, job.job_id, 1, timeout_s=WAIT_S)
            return job.job_id
        finally:
            await client.close()

    async def cancel(job_id: str) -> None:
        client = stack.coordinator_client(running_stack)
        try:
            await client.cancel_job(job_id)
        finally:
            await client.close()

    job_id = asyncio.run(start())
    yield job_id
    asyncio.run(cancel(job_id))


def _cli(running_stack: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "libra_cli.main", "--run-root",
                           running_stack["run_root"], *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def _browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        opts.add_argument(arg)
    opts.binary_location = str(CHROMIUM)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _points(driver: Any) -> int:
    return int(driver.find_element("id", "curve").get_attribute("data-points") or 0)


@pytest.mark.skipif(not HAS_BROWSER, reason=f"needs {CHROMIUM} and chromedriver (Debian "
                    "chromium + chromium-driver; scripts/setup_system.sh installs them)")
def test_the_page_follows_a_real_job_without_console_errors(
        running_stack: dict[str, Any], running_job: str, tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    coordinator = next(s for s in running_stack["services"] if s["name"] == "coordinator")
    http_port = next(a.split("=", 1)[1] for a in coordinator["args"]
                     if a.startswith("--http-port="))
    token = (secrets_dir(Path(running_stack["run_root"])) / "api_token").read_text().strip()
    base = f"http://127.0.0.1:{http_port}"
    driver = _browser()
    try:
        driver.get(f"{base}/ui/jobs/{running_job}?token={token}&interval_ms=500")
        assert driver.current_url == f"{base}/ui/jobs/{running_job}?interval_ms=500"
        WebDriverWait(driver, 30).until(lambda d: _points(d) >= 1)
        first = _points(driver)
        # Gains points between polls: the trainer reports a step, the next poll draws it.
        WebDriverWait(driver, WAIT_S, poll_frequency=0.5).until(
            lambda d: _points(d) > first)
        assert driver.find_element("id", "state").text == "running"
        verdict = driver.find_element("id", "verdict").text
        assert verdict.split(":")[0] in VERDICTS, verdict
        assert driver.find_element("id", "phases").text  # the step-time bars are drawn
        assert "rollout-0" in driver.find_element("id", "workers").text
        shot = tmp_path / "ui_job.png"
        assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 0
        print(f"screenshot: {shot}")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []
        driver.get(f"{base}/ui")  # the job picker lists it (cookie kept)
        WebDriverWait(driver, 30).until(
            lambda d: running_job in d.find_element("id", "jobs").text)
        driver.get(f"{base}/ui/jobs/no-such-job")
        assert driver.find_element("tag name", "h1").text == "No job 'no-such-job'"
    finally:
        driver.quit()


def test_top_renders_a_frame_from_the_live_stack(running_stack: dict[str, Any],
                                                 running_job: str) -> None:
    out = _cli(running_stack, "top", "--once")  # no --job: the running job is picked
    assert out.returncode == 0, out.stderr
    frame = out.stdout
    assert f"{running_job}  running  step " in frame
    for panel in ("verdict  ", "reward   ", "step time", "trajectories  produced",
                  "buckets", "workers", "events", "jobs and queue"):
        assert panel in frame, panel
    as_json = _cli(running_stack, "top", "--once", "--json", "--job", running_job)
    assert as_json.returncode == 0, as_json.stderr
    view = json.loads(as_json.stdout)
    assert view["job"]["job_id"] == running_job and view["curve"]
    assert view["verdict"]["kind"] in VERDICTS


def test_status_shows_the_running_jobs_counters(running_stack: dict[str, Any],
                                                running_job: str) -> None:
    out = _cli(running_stack, "status", "--json")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)["job"]
    assert (job["job_id"], job["state"]) == (running_job, "running")
    assert job["step"] >= 1 and job["trained"] >= 4 and job["verdict"] in VERDICTS
    text = _cli(running_stack, "status")
    assert f"job: job_id={running_job}" in text.stdout


def test_top_for_an_unknown_job_says_so(running_stack: dict[str, Any]) -> None:
    out = _cli(running_stack, "top", "--once", "--job", "no-such-job")
    assert out.returncode == 2
    assert "NotFound" in out.stderr and "no-such-job" in out.stderr
