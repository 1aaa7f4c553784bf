"""``libra status``: the stack's services with their leases, and the running job.

The services' rows come from the stack state and a health check each; leases and the
job's counters from the coordinator, under one deadline (``--timeout``). When the
coordinator does not answer in time or cannot be reached, the output says so and how to
go on (exit 2), instead of reporting that no job runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from typing import Any

from libra import types as t
from libra.clients.coordinator import GrpcCoordinatorClient
from libra.errors import DeadlineExceeded, LibraError
from libra.grpc_auth import ClientAuth
from libra_cli import credentials, stack, top

DEFAULT_TIMEOUT_S = 3.0
# Exit codes: 1 no stack runs (as before); 2 the coordinator did not answer (as any
# command whose call to it fails, libra_cli/main.py).
EXIT_NO_STACK = 1
EXIT_NO_ANSWER = 2


@dataclass(frozen=True, slots=True)
class CoordinatorReads:
    """What ``libra status`` asks the coordinator; ``error`` says why it is missing."""

    leases: list[t.Lease]
    job: dict[str, Any] | None  # the running job's counters; None when none runs
    error: str = ""  # "": the coordinator answered


def positive_seconds(text: str) -> float:
    """``--timeout``: seconds, a number above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def with_leases(rows: list[dict[str, Any]], leases: list[t.Lease]) -> list[dict[str, Any]]:
    """Each service row gains its worker lease (worker_id, role, epoch, bucket), matched
    by worker id or address; rows without a live lease get empty values."""
    by_key = {**{lease.address: lease for lease in leases},
              **{lease.worker_id: lease for lease in leases}}
    out = []
    for row in rows:
        lease = by_key.get(row["name"]) or by_key.get(row["address"])
        out.append({**row, "worker_id": lease.worker_id if lease else "",
                    "role": lease.role.value if lease else "",
                    "epoch": lease.epoch if lease else 0,
                    "bucket": lease.bucket if lease else ""})
    return out


async def read_coordinator(address: str, timeout_s: float,
                           auth: ClientAuth | None = None) -> CoordinatorReads:
    """The live leases and the running job's counters, all within ``timeout_s`` (the
    reads are several calls: each alone under the deadline could add up past it)."""
    client = GrpcCoordinatorClient(address, timeout_s=timeout_s, auth=auth)
    try:
        async with asyncio.timeout(timeout_s):
            leases = await client.list_workers()
            running = [j for j in await client.list_jobs() if j.state is t.JobState.RUNNING]
            if not running:
                return CoordinatorReads(leases, None)
            view = await top.fetch_view(client, running[-1].job_id)
            return CoordinatorReads(leases, top.job_counters(view))
    except (TimeoutError, DeadlineExceeded):
        return CoordinatorReads([], None, no_answer_message(address, timeout_s))
    except LibraError as exc:
        return CoordinatorReads([], None, f"coordinator at {address} failed: "
                                f"{type(exc).__name__}: {exc} (is it up? `libra logs "
                                "coordinator`)")
    finally:
        await client.close()


def no_answer_message(address: str, timeout_s: float) -> str:
    return (f"coordinator at {address} did not answer within {timeout_s:g} s (loaded or "
            f"stuck: try --timeout {max(10.0, 4 * timeout_s):g}, or `libra logs coordinator`)")


def cmd_status(args: argparse.Namespace) -> int:
    state = stack.read_state(args.run_root)
    if state is None:
        if args.json:
            _print_json({"running": False})
        else:
            print("running: False")
        return EXIT_NO_STACK
    reads = asyncio.run(read_coordinator(stack.coordinator_address(state), args.timeout,
                                         credentials.cli_auth(args)))
    services = with_leases(stack.status(state), reads.leases)
    if args.json:
        # Same keys either way; "job" is null both when none runs and when unknown,
        # "error" tells the two apart.
        _print_json({"services": services, "job": reads.job, "error": reads.error or None})
    else:
        for row in services:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
        if reads.error:
            print("job: unknown", flush=True)
        else:
            print("job: " + ("  ".join(f"{k}={v}" for k, v in reads.job.items())
                             if reads.job else "none running"))
    if reads.error:
        print(f"libra status: {reads.error}", file=sys.stderr)
        return EXIT_NO_ANSWER
    return 0


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))
