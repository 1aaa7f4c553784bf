"""The search tool reads a job's corpus only from its data roots (real files, real
symlinks, the real gateway core and registry); the gateway refuses to start with its
own corpus outside the roots."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from libra.types import ToolStatus
from services.toolgateway import __main__ as entry
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ToolCall, ToolGatewayCore, ToolGatewayLimits
from services.toolgateway.rewards import RewardRegistry
from services.toolgateway.sandbox import SubprocessSandbox
from services.toolgateway.tools import SearchConfig, ToolRegistry, builtin_tools


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The data root ``root/`` with ``kb.txt``; ``secret.txt`` lies beside it."""
    data = tmp_path / "root"
    data.mkdir()
    (data / "kb.txt").write_text("Zanzibar lies off the coast of Tanzania.\n\nBoats.\n")
    (tmp_path / "secret.txt").write_text("Zanzibar secret: the root password is hunter2\n")
    return data


@pytest.fixture
def rooted_core(sandbox: SubprocessSandbox, root: Path) -> ToolGatewayCore:
    search = SearchConfig(data_roots=(str(root),))
    return ToolGatewayCore(ToolRegistry(builtin_tools(sandbox, search=search)),
                           RewardRegistry([]), ToolGatewayLimits())


async def search(core: ToolGatewayCore, corpus: str, call_id: str = "s1"):
    return await core.execute(ToolCall("t", call_id, "search", {"query": "Zanzibar"},
                                       options={"corpus_paths": [corpus]}))


async def test_a_corpus_inside_the_root_is_searched(rooted_core, root: Path) -> None:
    result = await search(rooted_core, str(root / "kb.txt"))
    assert result.status is ToolStatus.SUCCESS and result.output.startswith("[1] Zanzibar")


async def test_a_corpus_outside_the_roots_fails_naming_the_path_and_roots(
        rooted_core, root: Path) -> None:
    secret = str(root.parent / "secret.txt")
    result = await search(rooted_core, secret)
    assert result.status is ToolStatus.FAILURE
    assert secret in result.error and str(root) in result.error
    assert "hunter2" not in result.output


async def test_a_symlink_in_the_root_pointing_outside_fails(rooted_core, root: Path) -> None:
    (root / "link.txt").symlink_to(root.parent / "secret.txt")
    result = await search(rooted_core, str(root / "link.txt"))
    assert result.status is ToolStatus.FAILURE and "outside the data roots" in result.error
    assert "hunter2" not in result.output


async def test_a_dotdot_escape_fails(rooted_core, root: Path) -> None:
    result = await search(rooted_core, f"{root}/../secret.txt")
    assert result.status is ToolStatus.FAILURE and "outside the data roots" in result.error


async def test_host_files_are_refused_with_the_default_roots(core) -> None:
    result = await search(core, "/etc/passwd")
    assert result.status is ToolStatus.FAILURE and "/etc/passwd" in result.error
    assert "root:" not in result.output


def test_the_gateway_refuses_to_start_with_its_corpus_outside_the_roots(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = ToolGatewayConfig(search_corpus=[str(root.parent / "secret.txt")],
                            data_roots=[str(root)])
    with pytest.raises(ValueError, match="outside data_roots"):
        entry.build_core(cfg)
    with caplog.at_level(logging.ERROR):
        assert entry.run(cfg) == 2
    assert "refusing to start" in caplog.text and "secret.txt" in caplog.text


async def test_the_gateway_config_reaches_the_search_tool(root: Path) -> None:
    core = entry.build_core(ToolGatewayConfig(search_corpus=[str(root / "kb.txt")],
                                              data_roots=[str(root)]))
    own = await core.execute(ToolCall("t", "s1", "search", {"query": "Zanzibar"}))
    assert own.output.startswith("[1] Zanzibar")
    outside = await search(core, str(root.parent / "secret.txt"), "s2")
    assert outside.status is ToolStatus.FAILURE
