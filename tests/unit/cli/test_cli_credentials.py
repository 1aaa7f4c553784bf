"""Which token the CLI sends: --token-file, then the environment, then the local stack's
own secrets (only for the stack's own addresses)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from libra.errors import InvalidArgument
from libra.grpc_auth import ClientAuth
from libra_cli.credentials import cli_auth
from libra_cli.stack_secrets import ensure_stack_secrets


def _args(run_root: Path, **kw: object) -> argparse.Namespace:
    base = {"run_root": run_root, "coordinator": "", "toolgateway": "", "token_file": None,
            "tls_ca_file": None}
    return argparse.Namespace(**{**base, **kw})


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LIBRA_AUTH__API_TOKEN", "LIBRA_AUTH__SERVICE_TOKEN",
                 "LIBRA_AUTH__TLS_CA_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_no_stack_and_no_setting_sends_nothing(tmp_path: Path) -> None:
    assert cli_auth(_args(tmp_path)) is None


def test_the_local_stack_gives_the_api_or_the_service_token(tmp_path: Path) -> None:
    secrets = ensure_stack_secrets(tmp_path)
    assert cli_auth(_args(tmp_path)) == ClientAuth(secrets.read("api_token"))
    assert cli_auth(_args(tmp_path), internal=True) == \
        ClientAuth(secrets.read("service_token"))


def test_an_explicit_address_never_gets_the_local_stacks_token(tmp_path: Path) -> None:
    ensure_stack_secrets(tmp_path)
    assert cli_auth(_args(tmp_path, coordinator="10.0.0.5:50051")) is None
    assert cli_auth(_args(tmp_path, toolgateway="10.0.0.5:50054"), internal=True) is None


def test_token_file_beats_env_beats_stack(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_stack_secrets(tmp_path)
    monkeypatch.setenv("LIBRA_AUTH__API_TOKEN", "from-env")
    monkeypatch.setenv("LIBRA_AUTH__TLS_CA_FILE", "/ca.pem")
    assert cli_auth(_args(tmp_path)) == ClientAuth("from-env", "/ca.pem")
    token = tmp_path / "tok"
    token.write_text("from-file\n")
    assert cli_auth(_args(tmp_path, token_file=token)).token == "from-file"


def test_a_missing_token_file_is_an_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="--token-file"):
        cli_auth(_args(tmp_path, token_file=tmp_path / "nope"))
