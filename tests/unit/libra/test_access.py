"""``libra.access``: the access table, token checks, token files and the exposure rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from libra.access import (
    PUBLIC_METHODS,
    TOKEN_CHECK_INTERVAL_S,
    Access,
    Tokens,
    TokenStore,
    bearer,
    check_exposure,
    is_loopback,
    libra_methods,
    load_tokens,
    method_access,
)
from libra.service_config import AuthConfig, ServerConfig
from libra_cli.stack_secrets import ensure_stack_secrets


def test_every_public_method_in_the_table_exists_in_the_protos() -> None:
    methods = libra_methods()
    listed = {f"/{svc}/{m}" for svc, names in PUBLIC_METHODS.items() for m in names}
    assert listed <= set(methods), listed - set(methods)
    assert {p for p, a in methods.items() if a is Access.PUBLIC} == listed


def test_job_methods_are_public_and_worker_control_is_internal() -> None:
    coord = "/libra.proto.coordinator.v1.CoordinatorService/"
    for name in ("CreateJob", "GetJob", "ListJobs", "CancelJob"):
        assert method_access(coord + name) is Access.PUBLIC
    for path in (coord + "AcquireLease", coord + "ReportStep", coord + "ChangeWorkerRole",
                 "/libra.proto.rollout.v1.RolloutService/Lend",
                 "/libra.proto.trainer.v1.TrainerService/StopJob",
                 "/libra.proto.scheduler.v1.SchedulerService/StartJob",
                 "/libra.proto.toolgateway.v1.ToolGatewayService/ExecuteToolCall"):
        assert method_access(path) is Access.INTERNAL, path


def test_unknown_methods_are_internal_and_health_is_open() -> None:
    assert method_access("/libra.proto.coordinator.v1.CoordinatorService/NewJobThing") \
        is Access.INTERNAL
    assert method_access("/grpc.health.v1.Health/Check") is Access.OPEN
    assert method_access("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") \
        is Access.OPEN


def test_tokens_grant_by_kind() -> None:
    tokens = Tokens(api="a" * 20, service="s" * 20)
    assert tokens.allows("s" * 20, Access.INTERNAL) is None
    assert tokens.allows("a" * 20, Access.PUBLIC) is None
    assert tokens.allows("a" * 20, Access.INTERNAL) is Access.PUBLIC  # -> permission denied
    assert tokens.allows("", Access.PUBLIC) is Access.OPEN  # -> unauthenticated
    assert tokens.allows("a" * 19, Access.PUBLIC) is Access.OPEN
    assert tokens.allows("", Access.OPEN) is None


def test_no_tokens_means_auth_off_and_empty_tokens_never_match() -> None:
    assert Tokens().allows("", Access.INTERNAL) is None
    only_service = Tokens(service="s")
    assert only_service.allows("", Access.PUBLIC) is Access.OPEN  # empty api token != ""


def test_bearer_parses_the_header() -> None:
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") == ""
    assert bearer("abc") == ""


def test_token_file_wins_and_a_bad_file_names_the_option(tmp_path: Path) -> None:
    path = tmp_path / "tok"
    path.write_text("from-file\n")
    assert load_tokens(AuthConfig(service_token="inline", service_token_file=str(path))) \
        == Tokens(service="from-file")
    with pytest.raises(ValueError, match="auth.api_token_file"):
        load_tokens(AuthConfig(api_token_file=str(tmp_path / "missing")))
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="auth.service_token_file.*empty"):
        load_tokens(AuthConfig(service_token_file=str(tmp_path / "empty")))


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "example.org", ""])
def test_exposed_hosts_need_a_service_token(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ValueError, match="AUTH__SERVICE_TOKEN"):
        check_exposure(host, Tokens(api="only-api"), "SCHEDULER_")
    check_exposure(host, Tokens(service="s"))  # no error


async def test_a_server_bound_beyond_loopback_without_a_token_refuses_to_start() -> None:
    from libra.grpcx import Server

    with pytest.raises(ValueError, match=r"server.host=0.0.0.0 .*LIBRA_TRAINER_AUTH__"):
        Server("trainer", ServerConfig(host="0.0.0.0", port=0, metrics_port=-1), [])


def test_stack_secrets_are_private_random_and_stable(tmp_path: Path) -> None:
    first = ensure_stack_secrets(tmp_path)
    assert os.stat(first.root).st_mode & 0o777 == 0o700
    values = {}
    for name in ("api_token", "service_token", "redis_password"):
        path = first.root / name
        assert path.stat().st_mode & 0o777 == 0o600
        values[name] = first.read(name)
        assert len(values[name]) >= 40
    assert len(set(values.values())) == 3
    again = ensure_stack_secrets(tmp_path)
    assert {n: again.read(n) for n in values} == values


def test_a_token_file_may_hold_several_tokens_the_first_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "tok"
    path.write_text("# rotation in progress\nnew-token\n\n  old-token  \n")
    tokens = load_tokens(AuthConfig(api_token_file=str(path)))
    assert (tokens.api, tokens.more_api) == ("new-token", ("old-token",))
    assert tokens.allows("old-token", Access.PUBLIC) is None
    assert tokens.allows("new-token", Access.PUBLIC) is None
    assert tokens.allows("# rotation in progress", Access.PUBLIC) is Access.OPEN
    (tmp_path / "comments").write_text("# only a comment\n")
    with pytest.raises(ValueError, match="auth.api_token_file.*empty"):
        load_tokens(AuthConfig(api_token_file=str(tmp_path / "comments")))


def test_an_extra_service_token_grants_internal_and_an_extra_api_token_public() -> None:
    tokens = Tokens(api="a1", service="s1", more_api=("a2",), more_service=("s2",))
    assert tokens.allows("s2", Access.INTERNAL) is None
    assert tokens.allows("a2", Access.INTERNAL) is Access.PUBLIC
    assert tokens.allows("a2", Access.PUBLIC) is None


def test_token_store_looks_at_its_files_once_per_interval(tmp_path: Path) -> None:
    path = tmp_path / "tok"
    path.write_text("one\n")
    now = [0.0]
    store = TokenStore(AuthConfig(api_token_file=str(path)), clock=lambda: now[0])
    path.write_text("two\n")
    now[0] = TOKEN_CHECK_INTERVAL_S / 2
    assert store.current().api == "one"  # not looked at yet
    now[0] = TOKEN_CHECK_INTERVAL_S
    assert store.current().api == "two"
