"""``libra tool``: run one tool call or list the tools, through the gateway or in-process.

Examples:
  libra tool run calculator --args '{"expression": "6*7"}'         the running stack's gateway
  libra tool run python --args '{"code": "print(1)"}' --local      in-process, no stack needed
  libra tool run search --args '{"query": "x"}' --toolgateway 127.0.0.1:50054
  libra tool list --json
  libra tool rewards --local                                         the registered rewards

``run`` prints the result as JSON (status, output, error, payload_tokens, size_class,
latency_ms, state, truncated) and exits 0 when the tool succeeded, 1 when it failed or
timed out, 2 when the call was refused (unknown tool, bad arguments, no gateway).
``--local`` builds the gateway core in this process (``services.toolgateway.local``) with
the default limits and sandbox, but without the calculator's injected "busy" failures.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from libra import types as t
from libra_cli.launcher import read_state

SERVICE = "toolgateway"


def _address(args: argparse.Namespace) -> str:
    if args.toolgateway:
        return args.toolgateway
    state = read_state(args.run_root)
    svc = next((s for s in (state or {}).get("services", []) if s["name"] == SERVICE), None)
    if svc is None:
        sys.exit("libra: no stack with a tool gateway is running (libra up); pass "
                 "--toolgateway HOST:PORT, or --local to run the tool in this process")
    return f"127.0.0.1:{svc['port']}"


def _parse_args_json(text: str) -> dict[str, Any] | str:
    """The decoded ``--args`` object, or an error message naming ``--args``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"--args is not valid JSON ({exc}): {text!r}"
    if not isinstance(value, dict):
        return f"--args must be a JSON object such as '{{\"code\": \"print(1)\"}}', got {text!r}"
    return value


def result_row(tool: str, call_id: str, res: t.ToolResult) -> dict[str, Any]:
    """The JSON object ``libra tool run`` prints."""
    return {"tool": tool, "call_id": call_id, "status": res.status.value,
            "output": res.output, "error": res.error, "payload_tokens": res.payload_tokens,
            "size_class": res.state.size_class.value, "latency_ms": res.latency_ms,
            "state": res.state.key, "truncated": res.truncated}


async def cmd_run(args: argparse.Namespace) -> int:
    tool_args = _parse_args_json(args.args)
    if isinstance(tool_args, str):
        print(f"libra: {tool_args}", file=sys.stderr)
        return 2
    call_id = args.call_id or f"cli-{uuid.uuid4().hex[:12]}"
    if args.local:
        from services.toolgateway.local import run_tool

        res = await run_tool(args.tool, tool_args, call_id=call_id,
                             deadline_ms=args.deadline_ms)
    else:
        from libra.clients.toolgateway import GrpcToolGatewayClient
        from libra_cli.credentials import cli_auth

        client = GrpcToolGatewayClient(_address(args), timeout_s=args.deadline_ms / 1000 + 5,
                                       auth=cli_auth(args, internal=True))
        try:
            res = await client.execute("cli", call_id, args.tool, tool_args, args.deadline_ms)
        finally:
            await client.close()
    row = result_row(args.tool, call_id, res)
    print(json.dumps(row) if args.json else json.dumps(row, indent=2))
    return 0 if res.status is t.ToolStatus.SUCCESS else 1


async def cmd_list(args: argparse.Namespace) -> int:
    if args.local:
        from services.toolgateway.local import list_tools

        tools = list_tools()
    else:
        from libra.clients.toolgateway import GrpcToolGatewayClient
        from libra_cli.credentials import cli_auth

        client = GrpcToolGatewayClient(_address(args), auth=cli_auth(args, internal=True))
        try:
            tools = await client.list_tools()
        finally:
            await client.close()
    if args.json:
        print(json.dumps(tools, indent=2))
    else:
        for spec in tools:
            args_names = ",".join(spec["args_schema"].get("properties", {}))
            print(f"{spec['name']}  args={args_names}  idempotent={spec['idempotent']}  "
                  f"{spec['description']}")
    return 0


async def cmd_rewards(args: argparse.Namespace) -> int:
    if args.local:
        from services.toolgateway.local import list_rewards

        rewards = list_rewards()
    else:
        from libra.clients.toolgateway import GrpcToolGatewayClient

        client = GrpcToolGatewayClient(_address(args))
        try:
            rewards = await client.list_rewards()
        finally:
            await client.close()
    if args.json:
        print(json.dumps(rewards, indent=2))
    else:
        for reward in rewards:
            print(f"{reward['name']}  {reward['description']}")
    return 0


def register(sub: Any) -> None:
    """Add ``tool run``, ``tool list`` and ``tool rewards`` to the CLI's subparsers."""
    parser = sub.add_parser("tool", help="run one tool call, or list the tools or rewards",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    tool_sub = parser.add_subparsers(dest="tool_command", required=True)

    def add(name: str, func: Any, help_text: str) -> argparse.ArgumentParser:
        p = tool_sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="compact machine-readable output")
        p.add_argument("--local", action="store_true",
                       help="build the gateway core in this process instead of calling one")
        p.add_argument("--toolgateway", default="",
                       help="gateway address HOST:PORT (default: from the running stack)")
        p.set_defaults(func=func)
        return p

    p = add("run", cmd_run, "execute one tool call and print the result as JSON")
    p.add_argument("tool", help="tool name (see `libra tool list`)")
    p.add_argument("--args", required=True, metavar="JSON",
                   help='tool arguments as a JSON object, e.g. \'{"code": "print(1)"}\'')
    p.add_argument("--deadline-ms", type=int, default=15_000,
                   help="the call's deadline (default 15000)")
    p.add_argument("--call-id", default="", help="call id (default: random)")
    add("list", cmd_list, "the tools with their argument schemas")
    add("rewards", cmd_rewards, "the rewards a job may name in [reward] (built-ins, entry "
                                "points, the gateway's extra_rewards)")
