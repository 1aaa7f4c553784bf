"""``libra top``: the live web view's panels in the terminal, refreshed in place.

Examples:
  libra top                       the running job (else the newest), every 2 s; Ctrl-C ends
  libra top --job JOB --once      one frame of that job, then exit
  libra top --once --json         the run view as JSON (the body of GET /v1/jobs/{id}/view)

The frame is built with the coordinator's own function (``libra.run_view``) from the
job's records read over gRPC, so it shows what ``/ui`` shows: job and queue, the reward
curve, step-time phases, throughput, bucket placements and migrations, workers and
elastic events, and the bottleneck verdict (docs/observability.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from libra import types as t
from libra.errors import NotFound
from libra.run_view import EventLine, RunView, build_run_view, run_view_to_dict

_SPARKS = "▁▂▃▄▅▆▇█"
_CLEAR = "\x1b[H\x1b[2J"  # cursor home + erase screen: the next frame replaces this one
FRAME_WIDTH = 96
"""Characters per line (a terminal of 100 columns shows a frame unwrapped)."""


async def fetch_view(client: Any, job_id: str = "") -> RunView:
    """The run view of ``job_id``, or of the running job (else the newest) when empty.

    NotFound when the coordinator has no such job, or no job at all.
    """
    jobs = await client.list_jobs()
    if not job_id:
        job_id = pick_job(jobs)
    job, steps, counters = await client.get_job(job_id)
    events = await client.get_job_events(job_id)
    return build_run_view(job, steps, counters, events, await client.list_workers(), jobs)


def pick_job(jobs: Sequence[t.Job]) -> str:
    """The running job's id, else the newest job's (NotFound when there is none)."""
    running = [j for j in jobs if j.state is t.JobState.RUNNING]
    chosen = running or sorted(jobs, key=lambda j: j.created_at_ms)
    if not chosen:
        raise NotFound("no job on this coordinator yet (libra submit JOB.toml)")
    return chosen[-1].job_id


def job_counters(view: RunView) -> dict[str, Any]:
    """The counters ``libra status`` shows of the running job (one flat object)."""
    job, c = view.job, view.counters
    return {"job_id": job.job_id, "name": job.name, "state": job.state, "step": job.step,
            "target_steps": job.target_steps, "policy_version": job.policy_version,
            "produced": c.produced, "trained": c.trained,
            "dropped_stale": c.dropped_stale, "dropped_failed": c.dropped_failed,
            "in_flight": c.in_flight, "reward_last": view.reward_last,
            "trajectories_per_s": view.throughput.trajectories_per_s,
            "verdict": view.verdict.kind}


def sparkline(values: Sequence[float], width: int) -> str:
    """The newest ``width`` values as block characters, scaled to their own range."""
    shown = list(values)[-width:]
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    span = (high - low) or 1.0
    return "".join(_SPARKS[min(7, int((v - low) / span * 7.999))] for v in shown)


def _bar(share: float, width: int = 24) -> str:
    filled = round(max(0.0, min(1.0, share)) * width)
    return "█" * filled + "·" * (width - filled)


def render(view: RunView, now_s: float | None = None) -> str:
    """One frame as text (no colours, so it reads the same in a log)."""
    job = view.job
    target = f"/{job.target_steps}" if job.target_steps else ""
    clock = time.strftime("%H:%M:%S", time.localtime(now_s))
    lines = [f"libra top  {job.name} {job.job_id}  {job.state}  step {job.step}{target}  "
             f"policy v{job.policy_version}  {clock}",
             f"verdict  {view.verdict.line}", ""]
    lines += _reward_panel(view)
    lines += ["", "step time (mean of the verdict's window)"]
    lines += [f"  {p.phase:<13}{_bar(p.share)} {p.mean_s:8.3f} s {p.share:5.0%}"
              for p in view.phases] or ["  no timed step yet"]
    tp = view.throughput
    lines.append(f"  step {tp.step_wall_s:.2f} s   {tp.trajectories_per_s:.2f} "
                 f"trajectories/s   {tp.tokens_per_s:.0f} tokens/s")
    c = view.counters
    lines += ["", f"trajectories  produced {c.produced}  trained {c.trained}  dropped "
              f"stale {c.dropped_stale}  failed {c.dropped_failed}  requeued {c.requeued}  "
              f"in flight {c.in_flight}", "", "buckets"]
    lines += [f"  {b.bucket:<13}{_bar(b.share)} {b.placed_total:6d} placed "
              f"(last step {b.placed_last_step})" for b in view.buckets] or ["  none yet"]
    lines.append(f"  migrations {view.migrations_total} (last step "
                 f"{view.migrations_last_step})")
    lines += ["", f"workers  (hybrid training {view.hybrid_training}, joining "
              f"{view.hybrid_joining})"]
    lines += [f"  {w.worker_id:<20} {w.role:<16} {w.bucket:<10} epoch {w.epoch}"
              for w in view.workers] or ["  no live lease"]
    lines += ["", "events (newest last)"]
    lines += [_event_line(e) for e in view.events] or ["  none"]
    lines += ["", "jobs and queue"]
    lines += [f"  {q.job_id:<28} {q.state:<10} step {q.step:<6} "
              f"{'queue ' + str(q.queue_position) if q.queue_position else ''}".rstrip()
              for q in view.queue] or ["  nothing running or queued"]
    return "\n".join(line[:FRAME_WIDTH] for line in lines)


def _event_line(event: EventLine) -> str:
    step = f"step {event.step}" if event.step else ""
    kind = event.kind + (f" (x{event.count})" if event.count > 1 else "")
    return f"  {step:<10} {kind:<24} {event.worker_id} {event.detail}".rstrip()


def _reward_panel(view: RunView) -> list[str]:
    rewards = [p.reward_mean for p in view.curve]
    last = "-" if view.reward_last is None else f"{view.reward_last:.3f}"
    lines = [f"reward   {sparkline(rewards, 60)}  last {last} ({len(rewards)} steps)"]
    if rewards:
        lines.append(f"         min {min(rewards):.3f}  max {max(rewards):.3f}")
    if view.evals:
        e = view.evals[-1]
        lines.append(f"eval     step {e.step}: reward {e.reward_mean:.3f}  accuracy "
                     f"{e.accuracy:.3f} ({len(view.evals)} rounds)")
    return lines


async def cmd_top(args: argparse.Namespace, client: Any) -> int:
    """Print frames until Ctrl-C (or one with ``--once``)."""
    try:
        while True:
            view = await fetch_view(client, args.job)
            if args.json:
                print(json.dumps(run_view_to_dict(view)), flush=True)
            else:
                print(("" if args.once else _CLEAR) + render(view), flush=True)
            if args.once:
                return 0
            await asyncio.sleep(args.interval_s)
    finally:
        await client.close()


def register(sub: Any, client_factory: Callable[[argparse.Namespace], Any]) -> None:
    """Add ``top`` to the CLI's subparsers (``client_factory(args)``: the coordinator's
    client)."""
    p = sub.add_parser("top", help="live view of a job in the terminal (the panels of the "
                       "web view /ui)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", default="", metavar="JOB_ID",
                   help="job to show (default: the running job, else the newest)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval-s", type=_interval, default=2.0, metavar="S",
                   help="seconds between frames (default 2; at least 0.2)")
    p.add_argument("--json", action="store_true",
                   help="the run view as JSON, one object per line per frame")

    async def run(args: argparse.Namespace) -> int:
        return await cmd_top(args, client_factory(args))

    p.set_defaults(func=run)


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.2 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be in [0.2, 3600] seconds, got {text}")
    return value

