"""The search tool reads a job's corpus only from its data roots (real files, real
symlinks, the real gateway core and registry), opened as an unprivileged uid when the
gateway runs as root (the tests run as root here); the gateway refuses to start with its
own corpus outside the roots."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from libra.types import ToolStatus
from services.toolgateway import __main__ as entry
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ToolCall, ToolGatewayCore, ToolGatewayLimits
from services.toolgateway.file_access import FileReaderConfig, JobFileReader
from services.toolgateway.rewards import RewardRegistry
from services.toolgateway.sandbox import SubprocessSandbox
from services.toolgateway.tools import SearchConfig, ToolRegistry, builtin_tools


@pytest.fixture
def root(readable_tmp: Path) -> Path:
    """The data root ``root/`` with ``kb.txt``; ``secret.txt`` lies beside it."""
    data = readable_tmp / "root"
    data.mkdir()
    (data / "kb.txt").write_text("Zanzibar lies off the coast of Tanzania.\n\nBoats.\n")
    (readable_tmp / "secret.txt").write_text("Zanzibar secret: the root password is hunter2\n")
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


# -- a job's corpus is opened as an unprivileged uid (services/toolgateway/file_access.py) --

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs a gateway running as root")


@root_only
async def test_a_root_only_file_inside_the_root_is_refused(rooted_core, root: Path) -> None:
    key = root / "key.txt"
    key.write_text("Zanzibar key: hunter2\n")
    key.chmod(0o600)  # root may read it; the reader's uid may not
    result = await search(rooted_core, str(key))
    assert result.status is ToolStatus.FAILURE
    assert result.error == (f"corpus unreadable: {key}: Permission denied (opened as uid "
                            "65534, not root: make the file and its folders readable to "
                            "that uid, or set the gateway's file_read_uid)")
    assert "hunter2" not in result.output


@root_only
async def test_root_group_membership_does_not_help(rooted_core, root: Path) -> None:
    key = root / "group.txt"
    key.write_text("Zanzibar group secret\n")
    key.chmod(0o640)  # group root: the reader runs with no supplementary groups
    result = await search(rooted_core, str(key))
    assert result.status is ToolStatus.FAILURE and "Permission denied" in result.error


@root_only
async def test_a_folder_the_reader_cannot_enter_hides_its_files(
        rooted_core, root: Path) -> None:
    private = root / "private"
    private.mkdir(mode=0o700)
    (private / "kb.txt").write_text("Zanzibar private\n")
    (private / "kb.txt").chmod(0o644)
    result = await search(rooted_core, str(private / "kb.txt"))
    assert result.status is ToolStatus.FAILURE and "Permission denied" in result.error


@root_only
async def test_the_same_file_made_world_readable_is_served(rooted_core, root: Path) -> None:
    key = root / "key.txt"
    key.write_text("Zanzibar public now\n")
    key.chmod(0o600)
    assert (await search(rooted_core, str(key), "s1")).status is ToolStatus.FAILURE
    key.chmod(0o644)
    served = await search(rooted_core, str(key), "s2")
    assert served.status is ToolStatus.SUCCESS and "public now" in served.output


@root_only
def test_a_fifo_or_folder_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "pipe")
    reader = JobFileReader([root.resolve()])
    for path in (root / "pipe", root):
        with pytest.raises(OSError) as err:
            reader.read_texts([str(path)])
        assert err.value.errno == errno.EINVAL and err.value.filename == str(path)


def test_reading_as_the_gateway_is_a_choice(root: Path) -> None:
    key = root / "key.txt"
    key.write_text("readable by the gateway's own user\n")
    key.chmod(0o600)
    reader = JobFileReader([root.resolve()], FileReaderConfig(uid=-1))
    assert not reader.drops_privileges
    assert reader.read_texts([str(key)]) == ["readable by the gateway's own user\n"]


def test_a_file_opened_outside_the_roots_is_refused(root: Path) -> None:
    # As if a symlink had been swapped in after the roots check: the descriptor's real
    # path decides, not the name that was checked.
    (root / "link.txt").symlink_to(root.parent / "secret.txt")
    reader = JobFileReader([root.resolve()])
    with pytest.raises(OSError, match="outside the data roots"):
        reader.read_texts([str(root / "link.txt")])


def test_an_oversized_file_is_refused_before_it_is_read(root: Path) -> None:
    reader = JobFileReader([root.resolve()], FileReaderConfig(max_file_bytes=10))
    with pytest.raises(OSError) as err:
        reader.read_texts([str(root / "kb.txt")])
    assert err.value.errno == errno.EFBIG


@pytest.mark.parametrize(("uid", "gid"), [(0, 65534), (-2, 65534), (65534, -5)])
def test_the_gateway_refuses_a_privileged_or_invalid_reader_id(uid: int, gid: int) -> None:
    with pytest.raises(ValueError, match="file_read_uid"):
        ToolGatewayConfig(file_read_uid=uid, file_read_gid=gid)
