"""glibc malloc thresholds for bulk byte streams (libra/allocator.py), measured in a
child process each: page faults of the chunk-sized allocate/free pattern of a weight
stream (a thread and the main thread, buffers of ~1 MiB made and dropped)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from libra.allocator import keep_freed_buffers

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = textwrap.dedent("""
    import resource, sys, threading
    from libra.allocator import keep_freed_buffers
    if sys.argv[1] == "tuned":
        assert keep_freed_buffers()

    def stream():  # per chunk: a read, a copy into a message, a slice out of it
        for _ in range(100):
            data = bytes(1 << 20)
            message = data + b"x"
            sliced = message[1:]
            del data, message, sliced

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    worker = threading.Thread(target=stream)
    worker.start()
    worker.join()
    stream()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _page_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=60)
    return int(out.stdout)


def test_chunk_buffers_are_reused_instead_of_faulted_in_again() -> None:
    if not keep_freed_buffers():
        pytest.skip("not glibc: the thresholds do not apply")
    # 200 chunks of 1 MiB, ~3 buffers each: 256 pages per buffer when each is mapped
    # afresh (~150k faults with glibc's defaults), a few pages each when reused.
    tuned, defaults = _page_faults("tuned"), _page_faults("defaults")
    assert tuned < 20 * 256, (tuned, defaults)
    assert defaults > 10 * tuned, (tuned, defaults)
