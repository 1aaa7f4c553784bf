"""``libra certs --out DIR``: a local CA plus server and client certificates (TLS).

Then serve TLS with ``LIBRA_AUTH__TLS_CERT_FILE=DIR/server.pem``,
``LIBRA_AUTH__TLS_KEY_FILE=DIR/server-key.pem`` and let clients (services calling peers,
the CLI) verify with ``LIBRA_AUTH__TLS_CA_FILE=DIR/ca.pem`` (docs/operations.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from libra.errors import InvalidArgument


def cmd_certs(args: argparse.Namespace) -> int:
    from libra_cli.tls_certs import make_certs  # cryptography loads only for this command

    if args.valid_days <= 0:
        raise InvalidArgument("--valid-days", f"must be > 0, got {args.valid_days}")
    paths = make_certs(args.out, hosts=args.host, valid_days=args.valid_days)
    files = {k: str(v) for k, v in dataclasses.asdict(paths).items()}
    env = {"LIBRA_AUTH__TLS_CERT_FILE": files["server"],
           "LIBRA_AUTH__TLS_KEY_FILE": files["server_key"],
           "LIBRA_AUTH__TLS_CA_FILE": files["ca"]}
    if args.json:
        print(json.dumps({"files": files, "env": env}, indent=2))
    else:
        print("\n".join(f"{name}: {path}" for name, path in files.items()))
        print("serve and verify TLS with:")
        print("\n".join(f"  export {k}={v}" for k, v in env.items()))
    return 0


def register(sub: Any) -> None:
    """Add ``certs`` to the CLI's subparsers."""
    p = sub.add_parser("certs", help="make a local CA and server/client TLS certificates",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder to write the PEM files to")
    p.add_argument("--host", action="append", default=[], metavar="NAME",
                   help="extra DNS name or IP the server certificate is valid for "
                   "(repeatable; localhost, 127.0.0.1 and ::1 are always included)")
    p.add_argument("--valid-days", type=int, default=365, help="validity (default 365)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_certs)
