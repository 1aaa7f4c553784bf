"""Entry point: ``python -m services.toolgateway``."""

from __future__ import annotations

import asyncio
import logging

from libra.config import load_config, redact
from libra.grpcx import Registration, serve
from libra.proto.toolgateway.v1 import toolgateway_pb2, toolgateway_pb2_grpc
from libra.telemetry import init_logging, init_tracing
from services.toolgateway.config import ToolGatewayConfig
from services.toolgateway.core import ToolGatewayCore, ToolGatewayLimits
from services.toolgateway.rewards import RewardRegistry, builtin_rewards, load_reward
from services.toolgateway.sandbox import SandboxConfig, SubprocessSandbox
from services.toolgateway.servicer import ToolGatewayServicer
from services.toolgateway.tools import (
    CalculatorConfig,
    SearchConfig,
    ToolRegistry,
    builtin_tools,
    load_tool,
)

logger = logging.getLogger("services.toolgateway")


def build_core(cfg: ToolGatewayConfig) -> ToolGatewayCore:
    """Wire the sandbox, the built-in and plugin tools and rewards into the core."""
    sandbox = SubprocessSandbox(SandboxConfig(
        require_network_isolation=cfg.require_network_isolation))
    search = SearchConfig(corpus_paths=tuple(cfg.search_corpus)) if cfg.search_corpus else None
    tools = ToolRegistry(builtin_tools(
        sandbox, CalculatorConfig(transient_failure_rate=cfg.calculator_transient_failure_rate),
        search))
    for path in cfg.extra_tools:
        tools.register(load_tool(path))
    rewards = RewardRegistry(builtin_rewards(sandbox))
    for path in cfg.extra_rewards:
        rewards.register(load_reward(path))
    limits = ToolGatewayLimits(max_concurrency_per_tool=cfg.max_concurrency_per_tool,
                               max_queue_depth_per_tool=cfg.max_queue_depth_per_tool)
    return ToolGatewayCore(tools, rewards, limits)


async def main(cfg: ToolGatewayConfig) -> None:
    core = build_core(cfg)
    name = toolgateway_pb2.DESCRIPTOR.services_by_name["ToolGatewayService"].full_name
    registration = Registration(toolgateway_pb2_grpc.add_ToolGatewayServiceServicer_to_server,
                                ToolGatewayServicer(core), name)
    await serve("toolgateway", cfg.server, [registration])


if __name__ == "__main__":
    config = load_config(ToolGatewayConfig, "toolgateway", description=__doc__)
    init_logging("toolgateway", config.telemetry)
    init_tracing("toolgateway", config.telemetry)
    logger.info("[startup] config=%s", redact(config))
    asyncio.run(main(config))
