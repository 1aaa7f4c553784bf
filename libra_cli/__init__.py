"""The ``libra`` command, the launcher, the embedded Redis and the report: the
application over the services (docs/architecture.md).

``import libra`` first: it sets gRPC's GRPC_EXPERIMENTS default, which gRPC reads once,
when it is first imported, and every entry point here (``python -m libra_cli.main``,
``libra_cli.healthcheck``, ``libra_cli.launcher``) starts by importing this package.
"""

import os as _os

# Before anything imports grpc: `libra run --in-process` and `libra tool run --local`
# run the tool gateway's sandbox in this process, and grpc's fork handlers crash its
# forked children (see services/toolgateway/__main__.py).
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import libra  # noqa: E402, F401
