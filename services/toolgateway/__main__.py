"""Tool gateway service: sandboxed tools with limits, the causal signal of each tool
return, and rewards. Run: ``python -m services.toolgateway``.

Every option can also come from LIBRA_TOOLGATEWAY_<OPTION> (groups joined by __)
or from a TOML file given with --config."""

from __future__ import annotations

import os

# The sandbox forks this process; gRPC's fork handlers then crash ~30% of the children
# (SIGSEGV/SIGABRT). The switch is read when grpc is imported, so it is set first.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import asyncio  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402

from libra.config import load_config, redact  # noqa: E402
from libra.data_roots import describe_roots, inside_roots, resolve_roots  # noqa: E402
from libra.grpcx import Registration, serve  # noqa: E402
from libra.proto.toolgateway.v1 import toolgateway_pb2, toolgateway_pb2_grpc  # noqa: E402
from libra.telemetry import init_logging, init_tracing  # noqa: E402
from services.toolgateway import metrics as lane_metrics  # noqa: E402
from services.toolgateway.config import ToolGatewayConfig  # noqa: E402
from services.toolgateway.core import ToolGatewayCore, ToolGatewayLimits  # noqa: E402
from services.toolgateway.file_access import FileReaderConfig  # noqa: E402
from services.toolgateway.orphans import OrphanReaper, adopt_orphans, reap_every  # noqa: E402
from services.toolgateway.rewards import build_reward_registry  # noqa: E402
from services.toolgateway.sandbox import (  # noqa: E402
    IsolationUnavailable,
    SandboxConfig,
    SubprocessSandbox,
)
from services.toolgateway.servicer import ToolGatewayServicer  # noqa: E402
from services.toolgateway.tools import (  # noqa: E402
    CalculatorConfig,
    SearchConfig,
    build_tool_registry,
    builtin_tools,
)
from services.toolgateway.tools.search import SAMPLE_CORPUS  # noqa: E402

logger = logging.getLogger("services.toolgateway")
_FALSE = ("0", "false", "no", "off")


def check_fork_safety() -> bool:
    """Warn (and return False) when grpc is loaded with its fork handlers on."""
    if "grpc" not in sys.modules:
        return True
    if os.environ.get("GRPC_ENABLE_FORK_SUPPORT", "").strip().lower() in _FALSE:
        return True
    logger.warning("[startup] grpc was imported with GRPC_ENABLE_FORK_SUPPORT on: sandboxed "
                   "python calls may die with SIGSEGV/SIGABRT; set GRPC_ENABLE_FORK_SUPPORT="
                   "false before grpc is imported (python -m services.toolgateway does)")
    return False


def build_sandbox(cfg: ToolGatewayConfig) -> SubprocessSandbox:
    """The sandbox the tools and rewards run code in.

    Raises:
        IsolationUnavailable: as ``build_core``.
    """
    return SubprocessSandbox(SandboxConfig(
        require_network_isolation=cfg.require_network_isolation,
        uid_base=cfg.sandbox_uid_base, num_uids=cfg.sandbox_num_uids))


def build_core(cfg: ToolGatewayConfig,
               sandbox: SubprocessSandbox | None = None) -> ToolGatewayCore:
    """Wire the sandbox (``build_sandbox``'s unless given), the built-in and plugin
    tools and rewards into the core.

    Plugins come from ``libra.tools`` / ``libra.rewards`` entry points and the config's
    dotted paths. A plugin that fails to import stops the gateway (``PluginError`` naming
    the entry point and the error): skipping it would only move the failure to submit
    time, as an "unknown tool" that hides the cause.

    Raises:
        PluginError: A plugin cannot be loaded or breaks its contract.
        IsolationUnavailable: ``require_network_isolation`` is set and this kernel (or
            user) does not allow a network namespace. Without the flag the sandbox logs a
            warning instead and sandboxed code can reach the network.
    """
    sandbox = sandbox or build_sandbox(cfg)
    search = _search_config(cfg)
    tools = build_tool_registry(builtin_tools(
        sandbox, CalculatorConfig(transient_failure_rate=cfg.calculator_transient_failure_rate),
        search, python_timeout_s=cfg.python_timeout_s), cfg.extra_tools)
    rewards = build_reward_registry(sandbox, cfg.extra_rewards)
    limits = ToolGatewayLimits(max_concurrency_per_tool=cfg.max_concurrency_per_tool,
                               max_queue_depth_per_tool=cfg.max_queue_depth_per_tool)
    return ToolGatewayCore(tools, rewards, limits)


def _search_config(cfg: ToolGatewayConfig) -> SearchConfig:
    """The search tool's corpus and data roots; the gateway's own corpus obeys the roots
    too (ValueError naming the file otherwise)."""
    roots = resolve_roots(cfg.data_roots)
    for path in cfg.search_corpus:
        if not inside_roots(path, roots):
            raise ValueError(f"search_corpus {path!r} is outside data_roots "
                             f"({describe_roots(roots)})")
    corpus = tuple(cfg.search_corpus) or (str(SAMPLE_CORPUS),)
    return SearchConfig(corpus_paths=corpus, data_roots=tuple(cfg.data_roots),
                        file_reader=FileReaderConfig(uid=cfg.file_read_uid,
                                                     gid=cfg.file_read_gid))


async def main(cfg: ToolGatewayConfig, core: ToolGatewayCore | None = None,
               orphans: OrphanReaper | None = None) -> None:
    """Serve ``core`` (built here if None) and, while serving, reap the sandbox's
    ``orphans`` between calls (none given with a core: no reaping between calls)."""
    check_fork_safety()
    if core is None:
        sandbox = build_sandbox(cfg)
        core, orphans = build_core(cfg, sandbox), sandbox.orphans
    lane_metrics.register(core)
    name = toolgateway_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name
    registration = Registration(toolgateway_pb2_grpc.add_ToolGatewayServiceServicer_to_server,
                                ToolGatewayServicer(core), name)
    reaping = (None if orphans is None
               else functools.partial(reap_every, orphans, cfg.orphan_reap_interval_s))
    await serve("toolgateway", cfg.server, [registration], run=reaping, auth=cfg.auth)


def run(cfg: ToolGatewayConfig) -> int:
    """Build the core and serve until stopped; 2 when the host cannot meet the config."""
    try:
        sandbox = build_sandbox(cfg)
        core = build_core(cfg, sandbox)
    except ValueError as exc:  # a PluginError too; a search_corpus outside data_roots
        logger.error("[startup] refusing to start: %s", exc)
        return 2
    except IsolationUnavailable as exc:
        logger.error("[startup] refusing to start: %s. Run the gateway where unshare("
                     "CLONE_NEWNET) is allowed (root or CAP_SYS_ADMIN, or unprivileged user "
                     "namespaces), or set require_network_isolation=false to accept the risk",
                     exc)
        return 2
    # The sandbox reaps orphans where they come to this process: the tools' killed
    # leftovers then give their uids back whoever PID 1 is (orphans.py). Here, not in
    # build_core: a process that only embeds the core (the in-process loop, a test)
    # keeps its orphans going to its init.
    adopt_orphans()
    asyncio.run(main(cfg, core, sandbox.orphans))
    return 0


if __name__ == "__main__":
    config = load_config(ToolGatewayConfig, "toolgateway", description=__doc__)
    init_logging("toolgateway", config.telemetry)
    init_tracing("toolgateway", config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    sys.exit(run(config))
