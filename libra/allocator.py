"""Keep freed large buffers in the C heap (glibc ``mallopt``) for processes that move
bulk bytes: the trainer's weight server and the rollout's weight fetcher.

A weight stream allocates and frees buffers of about one chunk (1 MiB) several times per
chunk on each side: the file read, the protobuf field and its serialized message, gRPC's
receive buffer, the parsed ``data``. glibc serves such sizes with ``mmap`` and returns
them with ``munmap`` (or trims the heap top), so every chunk page-faulted its pages in
again: fresh pages zeroed and charged to the cgroup, 4 KiB at a time. Measured on one
538 MB fetch (benchmarks/bench_weight_fetch.py, 1 instance): system CPU 0.58-0.69 s on
the trainer and 0.72-0.80 s on the rollout with glibc's defaults, 0.17-0.25 s and
0.19-0.35 s with the thresholds below: the buffers are reused from the heap.

The cost is memory held: up to ``TRIM_THRESHOLD_BYTES`` of free heap top is kept per
arena instead of returned at once, and buffers up to ``MMAP_THRESHOLD_BYTES`` come from
the heap. Larger allocations (model tensors) are still mapped and unmapped as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Above the largest weight chunk a manifest is written with (libra.weight_sync, 1 MiB)
# and a gRPC message of it, with room for larger chunks.
MMAP_THRESHOLD_BYTES = 16 << 20
# Free memory at a heap's top kept for reuse before it is returned to the system.
TRIM_THRESHOLD_BYTES = 64 << 20


def keep_freed_buffers() -> bool:
    """Set glibc's mmap and trim thresholds (above) for this process; False where the C
    library is not glibc (musl, macOS): nothing changes there."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
          and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
    logger.info("[startup] malloc thresholds mmap=%d trim=%d set=%s", MMAP_THRESHOLD_BYTES,
                TRIM_THRESHOLD_BYTES, ok)
    return ok
