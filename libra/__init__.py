"""Libra: an adaptive runtime for agentic RL post-training.

Shared package: domain types, wire converters, typed clients, the config loader, the
gRPC server helper, telemetry, the Redis key catalogue and the ``libra`` CLI.
"""

import os as _os

__version__ = "0.1.0"

# gRPC core reads GRPC_EXPERIMENTS once, when grpc is first imported, so the default is
# set here: every Libra process imports this package before grpc. On grpcio 1.85 a
# server on the event-engine listener hands every read to a thread pool before the
# asyncio poller sees it: ~5 thread wake-ups per stream message against ~2 on the
# legacy listener, and the wake-ups preempt the trainer and rollouts on shared cores
# (benchmarks/bench_grpc_wakeups.py measures both). An explicit GRPC_EXPERIMENTS, even
# empty, keeps gRPC's own defaults (docs/operations.md).
GRPC_EXPERIMENTS_DEFAULT = "-event_engine_listener"
_os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS_DEFAULT)
