"""Run a service module under cProfile switched on and off by signals, so a profile
covers a benchmark's measured window only (not start-up nor the fill).

``python benchmarks/profile_window.py OUT.prof services.scheduler [ARGS...]``: SIGUSR1
starts profiling the main thread (the service's event loop), SIGUSR2 stops and writes
OUT.prof. bench_control_plane.py ``--profile window`` sends them at the window's ends.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from typing import Any


def main() -> None:
    out, module, *args = sys.argv[1:]
    profiler = cProfile.Profile()

    def start(*_: Any) -> None:
        profiler.enable()

    def stop(*_: Any) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = [module, *args]
    sys.path.insert(0, os.getcwd())  # the service's tree (a script's own folder is first)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
