"""Which credential the CLI sends (docs/operations.md, "Security").

The job commands (submit, jobs, cancel, report, status, run, export) send the api token;
``libra tool`` calls the tool gateway, an internal service, and sends the service token.
The first of these wins:

1. ``--token-file PATH`` (a file holding the token);
2. the environment: ``LIBRA_AUTH__API_TOKEN`` (``LIBRA_AUTH__SERVICE_TOKEN`` for tools);
3. the stack under ``--run-root`` (``libra up`` wrote ``.libra/secrets/``, mode 0600),
   only when the address comes from that stack too (no ``--coordinator`` or
   ``--toolgateway``): the local stack's token is never sent to another server.

``--tls-ca-file`` (or ``LIBRA_AUTH__TLS_CA_FILE``) makes the CLI verify a TLS server;
``LIBRA_AUTH__TLS_CLIENT_CERT_FILE``/``..._KEY_FILE`` add a client certificate (mutual TLS).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from libra.access import read_secret
from libra.config import env_flag
from libra.errors import InvalidArgument
from libra.grpc_auth import ClientAuth
from libra_cli.stack_secrets import stack_secrets


def stack_auth(run_root: Path, internal: bool = False) -> ClientAuth | None:
    """The local stack's token (the service token when ``internal``), or None."""
    found = stack_secrets(run_root)
    if found is None:
        return None
    token = found.read("service_token" if internal else "api_token")
    return ClientAuth(token=token) if token else None


def cli_auth(args: argparse.Namespace, internal: bool = False) -> ClientAuth | None:
    """The credential of one CLI call (see the module docstring for the order)."""
    name = "service_token" if internal else "api_token"
    token_file = str(getattr(args, "token_file", "") or "")
    try:
        token = read_secret(env_flag(f"LIBRA_AUTH__{name.upper()}"), token_file, name)
    except ValueError as exc:
        raise InvalidArgument("--token-file", str(exc)) from exc
    ca_file = str(getattr(args, "tls_ca_file", "") or "") or env_flag("LIBRA_AUTH__TLS_CA_FILE")
    explicit = getattr(args, "toolgateway" if internal else "coordinator", "")
    if not token and not explicit:
        local = stack_auth(args.run_root, internal)
        token = local.token if local is not None else ""
    cert, key = (env_flag("LIBRA_AUTH__TLS_CLIENT_CERT_FILE"),
                 env_flag("LIBRA_AUTH__TLS_CLIENT_KEY_FILE"))
    if not token and not ca_file:
        return None
    return ClientAuth(token=token, tls_ca_file=ca_file, tls_client_cert_file=cert,
                      tls_client_key_file=key)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The CLI's global credential options."""
    parser.add_argument("--token-file", type=Path, default=None,
                        help="file holding the bearer token (default: env "
                        "LIBRA_AUTH__API_TOKEN, else the running stack's own token)")
    parser.add_argument("--tls-ca-file", type=Path, default=None,
                        help="PEM CA that signed the server's certificate (TLS); see "
                        "`libra certs`")
