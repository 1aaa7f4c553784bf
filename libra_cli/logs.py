"""``libra logs SERVICE``: read (and follow) a bare-metal stack's log files.

The launcher writes each service's log to ``<run_root>/.libra/logs/<name>.log`` (rotated
by size into ``.log.1``, ``.log.2``, ...), the supervisor's to ``.libra/supervisor.log``
and, with ``libra up --observe``, the trace viewer's to ``logs/phoenix.log``. The files
stay after ``libra down``, so a stopped stack's logs can still be read.

Examples:
  libra logs coordinator                   the whole log (rotated files first)
  libra logs rollout-0 --since 10m         records of the last ten minutes
  libra logs trainer --since 2026-12-01T16:00:00   records from then on (UTC)
  libra logs scheduler -f                  print, then follow new lines (Ctrl-C ends)
  libra logs toolgateway --json            one JSON object per record
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from libra.errors import InvalidArgument
from libra_cli.gc import parse_duration_s
from libra_cli.launcher import DEFAULT_STACK, logs_dir, read_state, service_names

SUPERVISOR = "supervisor"
PHOENIX = "phoenix"
FOLLOW_POLL_S = 0.2
"""How often ``-f`` looks for new lines (a stat and a read; no inotify dependency)."""


def known_sources(run_root: Path, stack_file: Path = DEFAULT_STACK) -> list[str]:
    """The names ``libra logs`` accepts: the running stack's services (its state), or
    the ones `libra up` would start from ``stack_file``; the supervisor; the trace viewer
    when ``--observe`` ran it."""
    state = read_state(run_root)
    if state is not None:
        names = [svc["name"] for svc in state["services"]]
    else:
        names = service_names(tomllib.loads(stack_file.read_text()))
    extra = [SUPERVISOR]
    if (state or {}).get("observe") or (logs_dir(run_root) / f"{PHOENIX}.log").exists():
        extra.append(PHOENIX)
    return [*names, *extra]


def log_path(run_root: Path, name: str) -> Path:
    """The current log file of ``name`` (a service, the supervisor or the viewer)."""
    if name == SUPERVISOR:
        return run_root / ".libra" / "supervisor.log"
    return logs_dir(run_root) / f"{name}.log"


def log_files(current: Path) -> list[Path]:
    """The rotated files (oldest first) and then the current one, those that exist."""
    rotated = sorted(current.parent.glob(current.name + ".*"),
                     key=lambda p: int(p.suffix[1:]) if p.suffix[1:].isdigit() else -1,
                     reverse=True)
    return [p for p in [*rotated, current] if p.is_file() and p.suffix != ".tmp"]


def parse_since(text: str, now_s: float) -> float:
    """``--since``: a duration back from now (``30s``, ``10m``, ``2h``, ``1d``) or a
    timestamp (ISO 8601; UTC when it names no zone) -> Unix seconds.

    Raises:
        InvalidArgument: naming ``--since`` when it is neither.
    """
    try:
        return now_s - parse_duration_s(text, "--since")
    except InvalidArgument:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgument("--since", f"{text!r} is neither a duration like 10m, 2h, 1d "
                              "nor a timestamp like 2026-12-01T16:00:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # the services log in UTC
    return when.timestamp()


def record_time_s(line: str) -> float | None:
    """When a record was written: ``ts`` of a JSON line, or the leading
    ``YYYY-mm-dd HH:MM:SS,mmm`` (UTC) of a text line; None for a continuation line (a
    traceback's) or anything else, which belongs to the record above it."""
    if line.startswith("{"):
        try:
            ts = json.loads(line).get("ts")
        except (ValueError, AttributeError):
            return None
        return float(ts) if isinstance(ts, int | float) else None
    try:
        when = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return when.replace(tzinfo=UTC).timestamp()


def select(lines: Iterator[str], since_s: float | None) -> Iterator[str]:
    """The lines of records written at or after ``since_s`` (all without it); a line
    without its own time goes with the record before it."""
    keep = since_s is None
    for line in lines:
        at_s = record_time_s(line)
        if at_s is not None and since_s is not None:
            keep = at_s >= since_s
        if keep:
            yield line


def as_json(name: str, line: str) -> str:
    """One output record for ``--json``: a JSON log line with ``service`` set, or a text
    line as ``{service, ts, line}``."""
    if line.startswith("{"):
        try:
            entry = json.loads(line)
            if isinstance(entry, dict):
                return json.dumps({"service": name, **entry})
        except ValueError:
            pass
    return json.dumps({"service": name, "ts": record_time_s(line), "line": line})


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace") as fh:
        yield from _read_lines(fh)


def _read_lines(fh: TextIO) -> Iterator[str]:
    # readline, not iteration: follow() calls tell() on this handle afterwards.
    while line := fh.readline():
        yield line.rstrip("\n")


def follow(fh: TextIO, path: Path, out: TextIO, render: Any,
           poll_s: float = FOLLOW_POLL_S) -> None:
    """Print what is appended to ``path`` from ``fh``'s position (``fh`` is ``path``
    opened) until interrupted; a rotation (the file replaced or shrunk) is followed into
    the new file from its start."""
    inode = os.fstat(fh.fileno()).st_ino
    partial = ""
    try:
        while True:
            chunk = fh.read()
            if chunk:
                partial += chunk
                *complete, partial = partial.split("\n")
                for line in complete:
                    out.write(render(line) + "\n")
                out.flush()
                continue
            time.sleep(poll_s)
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue  # between the rename and the new file
            if stat.st_ino != inode or stat.st_size < fh.tell():
                fh.close()
                fh = path.open(encoding="utf-8", errors="replace")
                inode = stat.st_ino
    finally:
        fh.close()


def cmd_logs(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Print (and with ``-f`` follow) one service's log; exit 2 for an unknown name."""
    out = out or sys.stdout
    known = known_sources(args.run_root)
    if args.service not in known:
        print(f"libra logs: unknown service {args.service!r}; known: {', '.join(known)}",
              file=sys.stderr)
        return 2
    since_s = parse_since(args.since, time.time()) if args.since else None
    current = log_path(args.run_root, args.service)
    files = log_files(current)
    if not files and not args.follow:
        print(f"libra logs: no log yet for {args.service} ({current}); is the stack up "
              "(libra up)?", file=sys.stderr)
        return 1

    def render(line: str) -> str:
        return as_json(args.service, line) if args.json else line

    if not args.follow:
        _print_files(files, since_s, out, render)
        return 0
    while not current.exists():  # the service has not logged yet: wait for it
        time.sleep(FOLLOW_POLL_S)
    # The current file is opened before the log so far is printed, and followed from
    # where that print stopped: a line written (or a rotation) in between is not lost.
    with current.open(encoding="utf-8", errors="replace") as fh:
        _print_files([f for f in log_files(current) if f != current], since_s, out, render)
        _print_lines(_read_lines(fh), since_s, out, render)
        try:
            follow(fh, current, out, render)
        except KeyboardInterrupt:
            return 0
    return 0


def _print_files(files: list[Path], since_s: float | None, out: TextIO,
                 render: Any) -> None:
    for path in files:
        _print_lines(_lines(path), since_s, out, render)


def _print_lines(lines: Iterator[str], since_s: float | None, out: TextIO,
                 render: Any) -> None:
    for line in select(lines, since_s):
        out.write(render(line) + "\n")
    out.flush()


def register(sub: Any) -> None:
    """Add ``logs`` to the CLI's subparsers."""
    p = sub.add_parser("logs", help="print or follow a service's log (bare-metal stack)",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("service", metavar="SERVICE",
                   help="a service of the stack (coordinator, scheduler, trainer, "
                   "toolgateway, a rollout instance id), supervisor, or phoenix")
    p.add_argument("-f", "--follow", action="store_true",
                   help="after the log so far, print new lines as they are written "
                   "(Ctrl-C ends)")
    p.add_argument("--since", metavar="DURATION|TIMESTAMP", default="",
                   help="only records from then on: 30s, 10m, 2h, 1d back from now, or a "
                   "timestamp such as 2026-12-01T16:00:00 (UTC unless it names a zone)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per record: the service's JSON log line with "
                   "`service`, or {service, ts, line} for a text line")
    p.set_defaults(func=cmd_logs)
