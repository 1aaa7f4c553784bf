"""``libra gc``: delete old run folders and prune ended jobs' weight versions.

Job states come from the coordinator (the running stack, or ``--coordinator``), so a
queued or running job's folder is never touched. Folders under ``--run-root`` are the
ones considered (docs/operations.md, "Disk and retention"; rules in libra/retention.py).

Examples:
  libra gc --dry-run                 what would go, and the bytes it would free
  libra gc --older-than 2d           delete runs ended more than 2 days ago
  libra gc --older-than 0 --keep-last 0 --json
                                     delete every ended run
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable
from typing import Any

from libra.errors import InvalidArgument
from libra.retention import (
    DELETE,
    RetentionPolicy,
    action_bytes,
    apply_gc,
    plan_gc,
    scan_run_root,
    with_weight_pruning,
)

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration_s(text: str, option: str = "--older-than") -> float:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w`` or ``0`` -> seconds.

    Raises:
        InvalidArgument: naming ``option`` when ``text`` is none of these.
    """
    if text.strip() == "0":
        return 0.0
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument(option, f"{text!r} is not a duration like 30m, 12h, "
                              "7d, 2w or 0")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _count(name: str, value: int) -> int:
    if value < 0:
        raise InvalidArgument(name, f"must be >= 0, got {value}")
    return value


async def cmd_gc(args: argparse.Namespace, client: Any) -> dict[str, Any]:
    """Plan (and unless ``--dry-run`` carry out) the clean-up; the result to print."""
    max_age_s = parse_duration_s(args.older_than)
    policy = RetentionPolicy(max_age_s=max_age_s, keep_last=_count("--keep-last", args.keep_last),
                             keep_weight_versions=_count("--keep-weight-versions",
                                                         args.keep_weight_versions),
                             delete_all_ended=max_age_s == 0)
    folders = scan_run_root(args.run_root)  # before the jobs: see plan_gc
    try:
        jobs = await client.list_jobs()
    finally:
        await client.close()
    actions = with_weight_pruning(plan_gc(folders, jobs, policy, int(time.time() * 1000)),
                                  policy.keep_weight_versions)
    rows = [{"job_id": a.job_id, "state": a.state, "action": a.action, "reason": a.reason,
             "freed_bytes": action_bytes(a), "pruned_versions": a.prune_versions}
            for a in actions]
    if not args.dry_run:
        apply_gc(actions, args.run_root)
    return {"dry_run": args.dry_run, "run_root": str(args.run_root), "runs": rows,
            "num_deleted": sum(a.action == DELETE for a in actions),
            "freed_bytes": sum(row["freed_bytes"] for row in rows)}


def _print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2))
        return
    verb = "would free" if result["dry_run"] else "freed"
    for row in result["runs"]:
        print(f"{row['action']:<13} {row['job_id']}  {row['state']:<9} {row['reason']}"
              + (f"  ({row['freed_bytes'] / 2**20:.1f} MiB)" if row["freed_bytes"] else ""))
    print(f"{verb} {result['freed_bytes'] / 2**20:.1f} MiB under {result['run_root']}"
          f" ({result['num_deleted']} run folder(s) deleted)")


def register(sub: Any, client_factory: Callable[[argparse.Namespace], Any]) -> None:
    """Add ``gc`` to the CLI's subparsers; ``client_factory(args)`` gives the coordinator
    client (the running stack's, or ``--coordinator``)."""
    p = sub.add_parser("gc", help="delete run folders of jobs that ended long ago and "
                       "prune ended jobs' weight versions (queued/running jobs are kept)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--older-than", default="7d", metavar="DURATION",
                   help="delete runs that ended longer ago than this: 30m, 12h, 7d, 2w; 0 = "
                   "every ended run beyond --keep-last (default 7d)")
    p.add_argument("--keep-last", type=int, default=5, metavar="N",
                   help="always keep the N most recently ended runs (default 5)")
    p.add_argument("--keep-weight-versions", type=int, default=1, metavar="N",
                   help="weight versions kept in each kept ended run, newest first; 0 "
                   "keeps all (default 1; checkpoints are kept as they are)")
    p.add_argument("--dry-run", action="store_true",
                   help="only print what would be deleted and the bytes it would free")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    async def run(args: argparse.Namespace) -> int:
        result = await cmd_gc(args, client_factory(args))
        _print_result(result, args.json)
        return 0

    p.set_defaults(func=run)
