"""Container health probe: ``python -m libra_cli.healthcheck HOST:PORT``.

Calls the standard gRPC health service (``grpc.health.v1.Health/Check``) and exits 0
only when the answer is SERVING; 1 for NOT_SERVING, UNKNOWN, an unreachable address or a
timeout. Used by the compose health checks; imports nothing but grpc so it stays cheap.
Health needs no token; a TLS server needs ``--tls-ca-file`` (the CA of its certificate).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as fh:
        return fh.read()


def _channel(address: str, tls: tuple[str, str, str]) -> grpc.Channel:
    ca, cert, key = tls
    if not ca:
        return grpc.insecure_channel(address)
    creds = grpc.ssl_channel_credentials(_read(ca), _read(key), _read(cert))
    return grpc.secure_channel(address, creds)


def check(address: str, service: str = "", timeout_s: float = 2.0, tls_ca_file: str = "",
          tls_client_cert_file: str = "", tls_client_key_file: str = "") -> str:
    """The serving status name of ``service`` at ``address``, or ``UNREACHABLE``.
    TLS when ``tls_ca_file`` is set, with a client certificate when one is given."""
    tls = (tls_ca_file, tls_client_cert_file, tls_client_key_file)
    try:
        with _channel(address, tls) as channel:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.RpcError:
        return "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m libra_cli.healthcheck", description=__doc__)
    parser.add_argument("address", help="HOST:PORT of the gRPC server")
    parser.add_argument("--service", default="",
                        help="full service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=2.0, help="deadline in seconds")
    parser.add_argument("--tls-ca-file", default="",
                        help="PEM CA of a TLS server's certificate (default: plaintext)")
    parser.add_argument("--tls-client-cert-file", default="",
                        help="PEM client certificate (a server requiring mutual TLS)")
    parser.add_argument("--tls-client-key-file", default="", help="its private key")
    args = parser.parse_args(argv)
    status = check(args.address, args.service, args.timeout, args.tls_ca_file,
                   args.tls_client_cert_file, args.tls_client_key_file)
    print(status)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
