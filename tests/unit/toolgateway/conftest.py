"""Fixtures for the tool gateway unit tests.

The sandbox here is the real ``SubprocessSandbox`` (the boundary under test); tools that
need no processes are small in-file fakes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.toolgateway.core import ToolGatewayCore, ToolGatewayLimits
from services.toolgateway.rewards import RewardRegistry, builtin_rewards
from services.toolgateway.sandbox import SandboxConfig, SubprocessSandbox
from services.toolgateway.tools import ToolRegistry, builtin_tools


@pytest.fixture(scope="session")
def sandbox() -> SubprocessSandbox:
    return SubprocessSandbox(SandboxConfig(max_output_bytes=4096, max_processes=16,
                                           memory_limit_bytes=256 * 1024 * 1024))


@pytest.fixture
def core(sandbox: SubprocessSandbox) -> ToolGatewayCore:
    # A generous tool timeout: the tests that expect a timeout pass their own deadline,
    # and the others must not time out on a loaded machine (the output-cap test did at
    # the default 10 s while the suite ran beside two busy processes).
    return ToolGatewayCore(ToolRegistry(builtin_tools(sandbox, python_timeout_s=120.0)),
                           RewardRegistry(builtin_rewards(sandbox)), ToolGatewayLimits())


@pytest.fixture
def readable_tmp() -> Iterator[Path]:
    """A fresh folder (0755) the gateway's unprivileged file reader can reach.

    pytest's ``tmp_path`` lies under a 0700 root-owned folder, which the reader's uid
    (nobody) cannot traverse when the tests run as root, as a real data root would be
    unreadable to it (services/toolgateway/file_access.py).
    """
    folder = Path(tempfile.mkdtemp(prefix="libra-data-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)
