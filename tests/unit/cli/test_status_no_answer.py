"""``libra status`` when the coordinator does not answer: it says so, how to go on, and
exits 2, in text and in ``--json`` (before: ``job: none running`` / ``"job": null`` and
exit 0, as if no job ran). Real gRPC over a socket: a server that takes every call and
never answers, and a port nobody listens on (a stopped coordinator)."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from libra_cli import launcher
from libra_cli.main import main


class _NeverAnswers(grpc.GenericRpcHandler):
    """Every unary call waits until the test ends (a coordinator stuck under load)."""

    def __init__(self, release: threading.Event) -> None:
        self._release = release

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        def wait(_request: bytes, context: grpc.ServicerContext) -> bytes:
            self._release.wait()
            context.abort(grpc.StatusCode.UNAVAILABLE, "test over")

        return grpc.unary_unary_rpc_method_handler(wait)


@pytest.fixture
def silent_port() -> Iterator[int]:
    release = threading.Event()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         handlers=[_NeverAnswers(release)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    release.set()
    server.stop(grace=None)


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_state(run_root: Path, coordinator_port: int) -> None:
    """A stack state whose supervisor (this process) is alive and whose coordinator
    listens on ``coordinator_port``."""
    path = launcher.state_path(run_root)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({
        "supervisor_pid": os.getpid(), "run_root": str(run_root),
        "services": [{"name": "coordinator", "pid": os.getpid(), "port": coordinator_port,
                      "metrics_port": 0, "restarts": 0, "log_path": "coordinator.log",
                      "args": []}]}))


def status(run_root: Path, *extra: str) -> int:
    return main(["--run-root", str(run_root), "status", "--timeout", "0.5", *extra])


def test_a_coordinator_that_never_answers_is_named_with_what_to_try(
        tmp_path: Path, silent_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    write_state(tmp_path, silent_port)
    assert status(tmp_path) == 2
    out, err = capsys.readouterr()
    assert "job: unknown" in out and "none running" not in out
    assert f"127.0.0.1:{silent_port} did not answer within 0.5 s" in err
    assert "try --timeout 10" in err


def test_json_keeps_its_keys_and_carries_the_error(
        tmp_path: Path, silent_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    write_state(tmp_path, silent_port)
    assert status(tmp_path, "--json") == 2
    out, _err = capsys.readouterr()
    body = json.loads(out)
    assert set(body) == {"services", "job", "error"}
    assert body["job"] is None and "did not answer within 0.5 s" in body["error"]
    assert [row["name"] for row in body["services"]] == ["coordinator"]


def test_a_stopped_coordinator_is_named_too(
        tmp_path: Path, closed_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    write_state(tmp_path, closed_port)
    assert status(tmp_path, "--json") == 2
    body = json.loads(capsys.readouterr().out)
    assert body["job"] is None
    assert f"127.0.0.1:{closed_port}" in body["error"]
    assert "libra logs coordinator" in body["error"]


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_timeout_that_is_not_a_positive_number_is_refused_naming_the_option(
        tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--run-root", str(tmp_path), "status", "--timeout", value])
    assert exited.value.code == 2
    assert "--timeout" in capsys.readouterr().err


def test_no_stack_is_exit_1_as_before(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--run-root", str(tmp_path), "status", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"running": False}
