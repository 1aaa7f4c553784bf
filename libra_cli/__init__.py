"""The ``libra`` command, the launcher, the embedded Redis and the report: the
application over the services (docs/architecture.md).

``import libra`` first: it sets gRPC's GRPC_EXPERIMENTS default, which gRPC reads once,
when it is first imported, and every entry point here (``python -m libra_cli.main``,
``libra_cli.healthcheck``, ``libra_cli.launcher``) starts by importing this package.
"""

import libra  # noqa: F401
