"""``libra agent run``: drive a job's episodes with an agent program (docs/agent-endpoint.md).

The scheduler admits a job's prompts as usual (staleness budget, ``samples_per_prompt``
trajectories per prompt); for a job whose ``task.agent`` is ``external`` each admitted
trajectory is an episode offered at ``POST /v1/episodes``. The driver takes them as
they come and runs one copy of the program per episode, so each prompt gets
``samples_per_prompt`` copies (its GRPO group), with at most ``-n`` at once. Each copy
gets, in its environment, ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` for its episode,
``LIBRA_MODEL``, ``LIBRA_EPISODE_ID``, ``LIBRA_PROMPT`` (also on stdin) and
``LIBRA_PROMPT_MESSAGES`` (JSON, when the dataset row has chat messages). A copy closes
its episode with ``POST $OPENAI_BASE_URL/episodes/$LIBRA_EPISODE_ID/reward``; one that
exits 0 without doing so is closed by the driver without a reward (the job's reward
scores the last reply). A copy that fails or outlives ``--timeout-s`` (killed, by pid)
leaves its episode to time out on the rollout (dropped, counted).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from libra_cli import credentials, stack

# How long one ``POST /v1/episodes`` waits for an admitted episode (503 when none).
OPEN_WAIT_S = 2.0
POLL_S = 0.05
JOB_CHECK_S = 2.0
# When the job ends, copies get this long to exit by themselves (one that just closed
# its episode is finishing), then the rest are stopped.
STOP_GRACE_S = 5.0
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class _Copy:
    episode: dict[str, Any]
    proc: subprocess.Popen
    started_s: float


@dataclass
class Summary:
    """What a run did (``--json`` prints it)."""

    job_id: str
    episodes: int = 0
    exit_codes: Counter = field(default_factory=Counter)
    timed_out: int = 0
    closed_by_driver: int = 0
    stopped_at_job_end: int = 0
    job_state: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "episodes": self.episodes,
                "exit_codes": {str(k): v for k, v in sorted(self.exit_codes.items())},
                "timed_out": self.timed_out, "closed_by_driver": self.closed_by_driver,
                "stopped_at_job_end": self.stopped_at_job_end, "job_state": self.job_state}


class Driver:
    """Takes offered episodes and runs the program once per episode."""

    def __init__(self, http: httpx.Client, base_url: str, job_id: str, command: list[str],
                 max_running: int, timeout_s: float, max_episodes: int) -> None:
        self._http = http
        self._base_url = base_url.rstrip("/")
        self._command = command
        self._max_running = max_running
        self._timeout_s = timeout_s
        self._max_episodes = max_episodes
        self._running: list[_Copy] = []
        self.summary = Summary(job_id)

    def run(self) -> Summary:
        """Until the job ends (or ``max_episodes`` ran); then wait for the copies."""
        next_check_s = 0.0
        while not self._done_starting():
            if time.monotonic() >= next_check_s:
                self.summary.job_state = self._job_state()
                next_check_s = time.monotonic() + JOB_CHECK_S
                if self.summary.job_state in TERMINAL:
                    self._stop_all()  # their episodes can no longer be trained on
                    break
            self._reap()
            if len(self._running) < self._max_running:
                self._start_one()
            else:
                time.sleep(POLL_S)
        while self._running:
            self._reap()
            time.sleep(POLL_S)
        self.summary.job_state = self._job_state()
        return self.summary

    def _stop_all(self) -> None:
        deadline_s = time.monotonic() + STOP_GRACE_S
        while self._running and time.monotonic() < deadline_s:
            self._reap()
            time.sleep(POLL_S)
        for copy in self._running:
            if copy.proc.poll() is None:
                copy.proc.kill()  # this copy's pid only
                copy.proc.wait()
                self.summary.stopped_at_job_end += 1
            else:
                self.summary.exit_codes[copy.proc.returncode] += 1
        self._running = []

    def _done_starting(self) -> bool:
        return 0 < self._max_episodes <= self.summary.episodes

    def _job_state(self) -> str:
        response = self._http.get(f"{self._base_url}/v1/jobs/{self.summary.job_id}")
        _raise_for(response)
        return str(response.json()["state"]).lower()

    def _start_one(self) -> None:
        response = self._http.post(f"{self._base_url}/v1/episodes",
                                   json={"job_id": self.summary.job_id, "wait_s": OPEN_WAIT_S})
        if response.status_code == 503:  # nothing admitted yet: the budget is spent
            return
        _raise_for(response)
        episode = response.json()
        env = {**os.environ, "OPENAI_BASE_URL": episode["base_url"],
               "OPENAI_API_KEY": episode["api_key"], "LIBRA_MODEL": episode["model"],
               "LIBRA_EPISODE_ID": episode["episode_id"], "LIBRA_PROMPT": episode["prompt"]}
        if episode.get("prompt_messages"):
            env["LIBRA_PROMPT_MESSAGES"] = json.dumps(episode["prompt_messages"])
        proc = subprocess.Popen(self._command, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, start_new_session=True, text=True)
        assert proc.stdin is not None
        try:
            proc.stdin.write(episode["prompt"])
            proc.stdin.close()
        except BrokenPipeError:  # the program does not read stdin
            pass
        self._running.append(_Copy(episode, proc, time.monotonic()))
        self.summary.episodes += 1

    def _reap(self) -> None:
        still = []
        for copy in self._running:
            code = copy.proc.poll()
            if code is None and time.monotonic() - copy.started_s > self._timeout_s:
                copy.proc.kill()  # this copy's pid only
                copy.proc.wait()
                self.summary.timed_out += 1
                continue
            if code is None:
                still.append(copy)
                continue
            self.summary.exit_codes[code] += 1
            if code == 0:
                self._close_unrewarded(copy.episode)
        self._running = still

    def _close_unrewarded(self, episode: dict[str, Any]) -> None:
        """Close an episode its program left open (401: it closed it itself)."""
        response = self._http.post(
            f"{episode['base_url']}/episodes/{episode['episode_id']}/reward", json={},
            headers={"Authorization": f"Bearer {episode['api_key']}"})
        if response.status_code == 200:
            self.summary.closed_by_driver += 1


def _raise_for(response: httpx.Response) -> None:
    if response.status_code >= 400:
        sys.exit(f"libra agent run: {response.request.method} {response.request.url.path} "
                 f"-> {response.status_code}: {response.text}")


def rest_url(args: argparse.Namespace) -> str:
    """The coordinator's REST base URL: ``--url``, else the local stack's."""
    if args.url:
        return str(args.url)
    state = stack.read_state(args.run_root)
    if state is None:
        sys.exit("libra agent run: no stack is running (libra up), or pass --url")
    svc = next(s for s in state["services"] if s["name"] == "coordinator")
    port = next(a.split("=", 1)[1] for a in svc["args"] if a.startswith("--http-port="))
    return f"http://127.0.0.1:{port}"


def cmd_agent_run(args: argparse.Namespace) -> int:
    if args.n < 1 or args.timeout_s <= 0 or args.max_episodes < 0:
        sys.exit("libra agent run: -n must be >= 1, --timeout-s > 0, --max-episodes >= 0")
    auth = credentials.cli_auth(args)
    headers = {"Authorization": f"Bearer {auth.token}"} if auth and auth.token else {}
    with httpx.Client(headers=headers, timeout=OPEN_WAIT_S + 30.0) as http:
        driver = Driver(http, rest_url(args), args.job, shlex.split(args.command), args.n,
                        args.timeout_s, args.max_episodes)
        summary = driver.run()
    out = summary.as_dict()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print("\n".join(f"{k}: {v}" for k, v in out.items()))
    return 0 if summary.job_state == "succeeded" or args.max_episodes else 1


def register(sub: Any) -> None:
    """``libra agent run``."""
    agent = sub.add_parser("agent", help="drive an external-agent job with an agent program")
    actions = agent.add_subparsers(dest="agent_command", required=True)
    p = actions.add_parser(
        "run", help="run an agent program once per admitted episode of JOB",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True, help="a running job with task.agent = 'external'")
    p.add_argument("--command", required=True,
                   help='the agent program, e.g. "python examples/agents/calc_agent.py"')
    p.add_argument("-n", type=int, default=8, metavar="N",
                   help="copies running at once (default 8); each prompt gets "
                   "algorithm.samples_per_prompt copies, one per episode")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="kill a copy (by pid) running longer than this (default 300)")
    p.add_argument("--max-episodes", type=int, default=0,
                   help="stop after starting this many (default 0: until the job ends)")
    p.add_argument("--url", default="", help="coordinator REST URL (default: the local "
                   "stack's, from --run-root)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_agent_run)
