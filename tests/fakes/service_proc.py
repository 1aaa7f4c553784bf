"""A stand-in service process for supervisor tests: ``python -m tests.fakes.service_proc
exit CODE`` exits at once with CODE; ``... sleep`` runs until it is signalled."""

from __future__ import annotations

import sys
import time

if __name__ == "__main__":
    if sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    while True:
        time.sleep(3600)
