"""CPU time and wake-ups of a process, from /proc (for the benchmarks that compare
processes side by side)."""

from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_split_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of one process, apart (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def wakeups(pid: int) -> dict[str, int]:
    """Per thread id, the times the thread went to sleep and had to be woken: its
    voluntary context switches (/proc/PID/task/TID/status)."""
    out = {}
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        try:
            lines = status.read_text().splitlines()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        out[status.parent.name] = sum(int(line.split()[1]) for line in lines
                                      if line.startswith("voluntary_ctxt_switches"))
    return out
