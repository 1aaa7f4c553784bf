"""The ``libra`` command."""

import os as _os

# Before anything imports grpc: `libra run --in-process` and `libra tool run --local`
# run the tool gateway's sandbox in this process, and grpc's fork handlers crash its
# forked children (see services/toolgateway/__main__.py).
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
