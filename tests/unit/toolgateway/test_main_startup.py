"""``services.toolgateway.__main__``: config reaches the tools; isolation start-up rules."""

from __future__ import annotations

import logging

import pytest

from libra.types import ToolStatus
from services.toolgateway import __main__ as entry
from services.toolgateway import sandbox as sandbox_mod
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ToolCall
from services.toolgateway.sandbox import IsolationSupport, IsolationUnavailable


@pytest.fixture
def no_netns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the kernel refuses unshare(CLONE_NEWNET)."""
    real = sandbox_mod.probe_isolation()
    monkeypatch.setattr(sandbox_mod, "probe_isolation", lambda: IsolationSupport(
        is_root=real.is_root, has_netns=False, has_mountns=real.has_mountns))


def test_required_isolation_refuses_to_start(no_netns, monkeypatch, caplog):
    async def must_not_serve(*args, **kwargs):
        raise AssertionError("the gateway must not serve without network isolation")

    monkeypatch.setattr(entry, "main", must_not_serve)
    cfg = ToolGatewayConfig(require_network_isolation=True)
    with pytest.raises(IsolationUnavailable, match="network namespaces unavailable"):
        entry.build_core(cfg)
    with caplog.at_level(logging.ERROR):
        assert entry.run(cfg) == 2
    assert "refusing to start" in caplog.text and "require_network_isolation" in caplog.text


def test_missing_netns_only_warns_by_default(no_netns, caplog):
    with caplog.at_level(logging.WARNING):
        core = entry.build_core(ToolGatewayConfig())
    assert "sandboxed code CAN open network connections" in caplog.text
    assert [s.name for s in core.list_tools()] == ["calculator", "python", "search"]


@pytest.mark.parametrize("rate, statuses", [(1.0, {"failure"}), (0.0, {"success"})])
async def test_calculator_transient_rate_reaches_the_tool(rate, statuses):
    core = entry.build_core(ToolGatewayConfig(calculator_transient_failure_rate=rate))
    results = [await core.execute(ToolCall("t", f"c{i}", "calculator", {"expression": "1+1"}))
               for i in range(20)]
    assert {r.status.value for r in results} == statuses
    if rate == 1.0:
        assert {r.error for r in results} == {"busy"}


async def test_default_transient_rate_is_about_a_quarter():
    core = entry.build_core(ToolGatewayConfig())
    results = [await core.execute(ToolCall("t", f"c{i}", "calculator", {"expression": "2*3"}))
               for i in range(400)]
    busy = sum(r.status is ToolStatus.FAILURE and r.error == "busy" for r in results)
    assert 0.18 < busy / 400 < 0.32


def test_fork_safety_check(monkeypatch, caplog):
    monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", "false")
    assert entry.check_fork_safety()
    monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", "1")
    with caplog.at_level(logging.WARNING):
        assert not entry.check_fork_safety()
    assert "GRPC_ENABLE_FORK_SUPPORT" in caplog.text


def test_the_sandbox_uid_pool_comes_from_the_config(monkeypatch):
    """Two gateways on one host need disjoint uid ranges: the pool is a setting."""
    made = []

    class Recording(entry.SubprocessSandbox):
        def __init__(self, config):
            made.append(config)
            super().__init__(config)

    monkeypatch.setattr(entry, "SubprocessSandbox", Recording)
    entry.build_core(ToolGatewayConfig(sandbox_uid_base=880_000, sandbox_num_uids=32))
    assert [(c.uid_base, c.num_uids) for c in made] == [(880_000, 32)]
    with pytest.raises(ValueError, match="sandbox_uid_base"):
        ToolGatewayConfig(sandbox_uid_base=0)
