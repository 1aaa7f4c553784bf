"""``libra``: run the demo, manage the bare-metal stack, submit and inspect jobs.

Examples:
  libra run deploy/configs/demo.toml     start everything, submit, follow, report, stop
  libra run JOB.toml --in-process        the same in one process, no servers (debugging)
  libra up / libra down                  start / stop Redis + the five services
  libra status --json                    each service: name, pid, address, health, and
                                         its worker lease: role, epoch, bucket; the
                                         running job's counters and verdict
  libra submit JOB.toml; libra jobs      submit to a running stack; list jobs (a job
                                         submitted while one runs waits in the queue)
  libra submit JOB.toml --priority 5     queue ahead of lower priorities
  libra resume JOB                       restart a cancelled/failed job from its
                                         newest checkpoint, same id
  libra run JOB.toml --set algorithm.num_steps=20 --set model.dtype=bfloat16
                                         override spec fields (validated like the file)
  libra model import --smollm2           a GGUF -> Hugging Face directory (docs/models.md)
  libra export JOB --out DIR             a job's policy version -> Hugging Face directory
  libra tool run python --args '{"code": "print(1)"}' --local    try a tool
  libra agent run --job JOB --command "python examples/agents/calc_agent.py"
                                         an agent program per episode (docs/agent-endpoint.md)
  libra gc --dry-run                     what run folders / weight versions would go
  libra top                              live panels of the running job (as /ui shows)
  libra logs coordinator -f --since 10m  a service's log, then follow it
  libra up --observe                     also a local trace viewer (Phoenix) for the
                                         stack's spans (docs/observability.md)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.errors import InvalidArgument, LibraError
from libra.jobspec import JobSpec, job_spec_from_dict, parse_document
from libra.run_dir import is_dir_reference
from libra_cli import (
    agent,
    certs,
    credentials,
    gc,
    logs,
    model,
    run,
    sim,
    stack,
    status,
    tool,
    top,
)
from libra_cli.launcher import ROOT
from libra_cli.observe import ObserveOptions, default_venv
from libra_cli.report import build_report, write_report
from libra_cli.spec_overrides import apply_overrides
from scheduling.policy.registry import check_layout

FORMATS = {".toml": "toml", ".json": "json", ".yaml": "yaml", ".yml": "yaml"}


def _print(obj: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, indent=2))
    elif isinstance(obj, list):
        for row in obj:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
    else:
        print("\n".join(f"{k}: {v}" for k, v in obj.items()))


def _client(args: argparse.Namespace) -> GrpcCoordinatorClient:
    address = args.coordinator
    if not address:
        state = stack.read_state(args.run_root)
        if state is None:
            sys.exit("libra: no stack is running (libra up), or pass --coordinator HOST:PORT")
        address = stack.coordinator_address(state)
    return GrpcCoordinatorClient(address, auth=credentials.cli_auth(args))


def _job_row(job: t.Job) -> dict[str, Any]:
    return {"job_id": job.job_id, "name": job.name, "state": job.state.value,
            "queue_position": job.queue_position, "priority": job.priority,
            "step": job.step, "policy_version": job.policy_version,
            "num_resumes": job.num_resumes, "message": job.message}


def load_spec(path: Path, overrides: list[str]) -> tuple[dict[str, Any], JobSpec]:
    """The spec document with ``--set`` overrides applied, and its validated spec.

    Relative ``model.path``, ``task.path``, ``task.eval_path``, the files of
    ``tools.search_corpus`` and a directory given as ``algorithm.init_from`` are made
    absolute against the current directory: the services resolve paths from their own
    working directories, which may differ.
    Raises InvalidArgument naming the field, before anything is started or sent.
    """
    if not path.is_file():
        raise InvalidArgument("JOB", f"{path} is not a file")
    data = apply_overrides(parse_document(path.read_text(), FORMATS.get(
        path.suffix.lower(), "toml")), overrides)
    for name, key in _PATH_FIELDS:
        section = data.get(name)
        if isinstance(section, dict) and key in section:
            section[key] = _absolute(section[key])
    algorithm = data.get("algorithm")
    init_from = algorithm.get("init_from") if isinstance(algorithm, dict) else None
    if isinstance(init_from, str) and is_dir_reference(init_from):  # not a job id
        algorithm["init_from"] = str(Path(init_from).expanduser().resolve())
    spec = job_spec_from_dict(data)
    # The policy names live in their registry (the foundation's spec cannot import it):
    # checked here too so `libra run` refuses a misspelt policy before starting a stack.
    check_layout(spec.layout)
    return data, spec


_PATH_FIELDS = (("model", "path"), ("task", "path"), ("task", "eval_path"),
                ("tools", "search_corpus"))


def _absolute(value: Any) -> Any:
    """A non-empty path string (or each in a list) resolved; anything else unchanged
    (the spec's validation names a wrong type)."""
    if isinstance(value, list):
        return [_absolute(item) for item in value]
    if isinstance(value, str) and value:
        return str(Path(value).expanduser().resolve())
    return value


async def _submit(client: GrpcCoordinatorClient, data: dict[str, Any],
                  priority: int = 0) -> t.Job:
    return await client.create_job(json.dumps(data), "json", priority)


def _check_model_here(spec: JobSpec) -> None:
    """The coordinator's model and dataset checks, run before `libra run` starts the
    stack, so a bad model or dataset fails in seconds instead of after the services came
    up (torch and datasets load lazily)."""
    if spec.model.kind == "hf":
        from libra.models.inspect import validate_model_for_job

        validate_model_for_job(spec)
    if spec.task.is_file:
        from libra.data import check_job_dataset

        check_job_dataset(spec)


async def _report(client: GrpcCoordinatorClient, job_id: str, wall_s: float) -> dict[str, Any]:
    job, steps, counters = await client.get_job(job_id)
    events = await client.get_job_events(job_id)
    report = build_report(job, steps, counters, wall_s, events)
    path, png = write_report(report, Path(job.run_dir))
    report["_paths"] = {"report": str(path), "reward_curve": str(png) if png else ""}
    return report


def cmd_run(args: argparse.Namespace) -> int:
    """`libra run` (libra_cli/run.py: also the clean-up when interrupted)."""

    def load(a: argparse.Namespace) -> dict[str, Any]:
        data, spec = load_spec(a.job, a.set)
        _check_model_here(spec)
        return data

    if args.in_process:
        return run.cmd_run_in_process(args, load, _report, _print)
    return run.cmd_run(args, load, _report, _print)


async def cmd_submit(args: argparse.Namespace) -> int:
    data, _spec = load_spec(args.job, args.set)
    client = _client(args)
    job = await _submit(client, data, args.priority)
    _print(_job_row(job), args.json)
    return 0


async def cmd_jobs(args: argparse.Namespace) -> int:
    _print([_job_row(j) for j in await _client(args).list_jobs()], args.json)
    return 0


async def cmd_cancel(args: argparse.Namespace) -> int:
    _print(_job_row(await _client(args).cancel_job(args.job_id)), args.json)
    return 0


async def cmd_resume(args: argparse.Namespace) -> int:
    _print(_job_row(await _client(args).resume_job(args.job_id, args.priority)), args.json)
    return 0


async def cmd_report(args: argparse.Namespace) -> int:
    report = await _report(_client(args), args.job_id, 0.0)
    _print(report if args.json else report["_paths"], args.json)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    observe = None
    if args.observe:
        observe = ObserveOptions(args.phoenix_venv or default_venv(ROOT), args.phoenix_port,
                                 args.phoenix_grpc_port)
    state = stack.up(args.run_root, timeout_s=180.0 if observe else 90.0, observe=observe)
    _print(stack.status(state), args.json)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = stack.down(args.run_root)
    _print({"stopped": stopped}, args.json)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="libra", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-root", type=Path, default=Path("runs"),
                        help="folder holding run folders and the stack state (default runs)")
    parser.add_argument("--coordinator", default="", help="coordinator address (HOST:PORT)")
    credentials.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=func)
        return p

    p = add("run", cmd_run, "start the stack, submit JOB, follow it, write the report, stop")
    p.add_argument("job", type=Path, help="job spec file (.toml, .json, .yaml)")
    _add_set(p)
    p.add_argument("--keep-up", action="store_true", help="leave the stack running")
    p.add_argument("--in-process", action="store_true",
                   help="debug: run the five service cores in this process over a "
                   "throwaway Redis, no servers (libra_cli/inprocess_loop.py; one rollout "
                   "instance per bucket, no elastic pool)")
    p = add("up", cmd_up, "start Redis and the five services (bare metal, supervised by pid)")
    p.add_argument("--observe", action="store_true",
                   help="also start a local trace viewer (Arize Phoenix, offline) and send "
                   "every service's spans to it; `libra status` shows its URL "
                   "(needs `make observe-venv`; docs/observability.md)")
    p.add_argument("--phoenix-venv", type=Path, default=None, metavar="DIR",
                   help="the Phoenix virtualenv (default $LIBRA_PHOENIX_VENV, else "
                   ".venv-phoenix in the repository)")
    p.add_argument("--phoenix-port", type=int, default=0, metavar="PORT",
                   help="Phoenix UI/REST port on 127.0.0.1 (default: a free one)")
    p.add_argument("--phoenix-grpc-port", type=int, default=0, metavar="PORT",
                   help="Phoenix OTLP/gRPC receiver port (default: a free one)")
    add("down", cmd_down, "stop what `libra up` started, by pid")
    p = add("status", status.cmd_status, "name, pid, address, health and lease (role, "
            "epoch, bucket) of each service, and the running job's counters (steps, "
            "trajectories, reward, throughput, bottleneck verdict); --json: {services: "
            "[...], job: {...} | null, error: null | why the coordinator did not answer}. "
            "Exit 1: no stack runs; 2: the coordinator did not answer (the message says "
            "what to try)")
    p.add_argument("--timeout", type=status.positive_seconds,
                   default=status.DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="how long to wait for the coordinator's answers, all together "
                   f"(default {status.DEFAULT_TIMEOUT_S:g}; raise it on a loaded host)")
    p = add("submit", cmd_submit, "submit a job spec to the running stack; while another "
            "job runs it waits PENDING in the queue (docs/jobs.md)")
    p.add_argument("job", type=Path, help="job spec file (.toml, .json, .yaml)")
    _add_set(p)
    _add_priority(p)
    add("jobs", cmd_jobs, "list jobs: state, queue_position (1 = starts next, 0 = not "
        "queued), priority, step")
    p = add("cancel", cmd_cancel, "cancel a job (a queued one just leaves the queue)")
    p.add_argument("job_id", help="the job's id (libra jobs lists them)")
    p = add("resume", cmd_resume, "restart a cancelled or failed job from its newest "
            "checkpoint under the same id (queued while another job runs)")
    p.add_argument("job_id", help="the job's id (libra jobs lists them)")
    _add_priority(p)
    p = add("report", cmd_report, "write report.json and the reward curve of a job")
    p.add_argument("job_id", help="the job's id (libra jobs lists them)")
    tool.register(sub)
    certs.register(sub)
    sim.register(sub)
    model.register(sub)
    agent.register(sub)
    gc.register(sub, _client)
    top.register(sub, _client)
    logs.register(sub)
    return parser


def _add_priority(p: argparse.ArgumentParser) -> None:
    p.add_argument("--priority", type=int, default=0, metavar="N",
                   help="queue priority in [-1000, 1000]: higher starts first, FIFO among "
                   "equals (default 0)")


def _add_set(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a spec field (repeatable; VALUE is read as TOML, e.g. "
                   "--set algorithm.num_steps=20 --set model.path=models/m)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.run_root = args.run_root.resolve()
    try:
        if asyncio.iscoroutinefunction(args.func):
            return asyncio.run(args.func(args))
        return args.func(args)
    except LibraError as exc:
        print(f"libra: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C ends a live command (libra top) quietly
        return 130


if __name__ == "__main__":
    sys.exit(main())
