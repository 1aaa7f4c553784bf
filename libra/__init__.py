"""Libra: an adaptive runtime for agentic RL post-training.

Shared package: domain types, wire converters, typed clients, the config loader, the
gRPC server helper, telemetry, the Redis key catalogue and the ``libra`` CLI.
"""

__version__ = "0.1.0"
